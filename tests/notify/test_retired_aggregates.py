"""Retired aggregates (services/notify/retirement.py): a file's terminal event
(`file.purged`) is applied in version order, tells nobody and retires the file; every
later event of it is skipped as old (parked ones included), a duplicate of an old event has
no effect, and the retention job deletes the retired row (and any parked event of it) only
after its window. The migration keeps existing rows live. SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from alembic import command
from notify.harness import SERVICE, event
from prometheus_client import REGISTRY
from serentak.notify.v1 import notify_pb2
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.db import create_engine, session_factory
from services.common.migrate import alembic_config
from services.notify import database as notify_db
from services.notify.aggregate_lock import lock_aggregate
from services.notify.clock import utcnow
from services.notify.inbox_rows import row_values
from services.notify.models import AggregateVersion, InboxEvent, InboxStatus
from services.notify.parked import parked_stats
from services.notify.retention import purge
from services.notify.retirement import RETIRED

pb = notify_pb2
DAY = timedelta(days=1)
WINDOW = 30 * DAY


@pytest.fixture
async def sessions(notify) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on the running service's database, to read its rows."""
    engine = create_engine(notify.settings.database_url)
    yield session_factory(engine)
    await engine.dispose()


async def _row(sessions, file_id: str) -> AggregateVersion | None:
    async with sessions() as session:
        return await session.get(AggregateVersion, file_id)


async def _statuses(sessions, file_id: str) -> dict[int, str]:
    async with sessions() as session:
        rows = await session.execute(
            select(InboxEvent.version, InboxEvent.status).where(InboxEvent.aggregate_id == file_id)
        )
        return {v: s for v, s in rows if s != InboxStatus.NOTIFIED}


async def _versions_told(notify, user: str, file_id: str) -> list[int]:
    return sorted(n.version for n in await notify.all_notifications(user) if n.file_id == file_id)


async def test_the_terminal_event_retires_the_file_tells_nobody_and_ends_it(
    notify, sessions
) -> None:
    assert (await notify.ingest(event("f-end", 1))).outcome == pb.INGEST_OUTCOME_APPLIED
    # An event after the end (a producer bug) waits behind the missing version 2 ...
    late = event("f-end", 3)
    assert (await notify.ingest(late)).outcome == pb.INGEST_OUTCOME_PARKED
    # ... which is the terminal event: applied in order, with an audience even, to nobody.
    end = await notify.ingest(event("f-end", 2, kind="purged", audience=("alice", "bob")))
    assert end.outcome == pb.INGEST_OUTCOME_APPLIED
    assert end.notifications_written == 0
    await notify.settled()
    row = await _row(sessions, "f-end")
    assert row is not None and row.applied_version == 2 and row.retired_at is not None
    # The parked event after it is old now: nothing waits for a version that cannot come.
    assert await _statuses(sessions, "f-end") == {3: InboxStatus.SKIPPED_OLD}
    async with sessions() as session:
        assert (await parked_stats(session)).events == 0
    # Every later event is skipped as old, whatever its version.
    for ev in (event("f-end", 4), event("f-end", 3), event("f-end", 10**9)):
        assert (await notify.ingest(ev)).outcome == pb.INGEST_OUTCOME_SKIPPED_OLD
    await notify.settled()
    for user in ("alice", "bob"):
        assert await _versions_told(notify, user, "f-end") == [1]
    # Ingest reads the retired row as beyond any version.
    async with sessions() as session, session.begin():
        assert await lock_aggregate(session, "f-end") == RETIRED


async def test_a_batch_accepts_nothing_after_the_terminal_event(notify, sessions) -> None:
    batch = [event("f-batch-end", 1), event("f-batch-end", 2, kind="purged", audience=())]
    batch.append(event("f-batch-end", 3))
    resp = await notify.stub.IngestBatch(pb.IngestBatchRequest(events=batch), metadata=SERVICE)
    assert [r.outcome for r in resp.results] == [
        pb.INGEST_OUTCOME_APPLIED,
        pb.INGEST_OUTCOME_APPLIED,
        pb.INGEST_OUTCOME_SKIPPED_OLD,
    ]
    await notify.settled()
    row = await _row(sessions, "f-batch-end")
    assert row is not None and row.applied_version == 2 and row.retired_at is not None
    assert await _versions_told(notify, "alice", "f-batch-end") == [1]


async def test_a_duplicate_of_an_old_event_after_the_purge_has_no_effect(notify, sessions) -> None:
    v1, v2 = event("f-dup", 1), event("f-dup", 2)
    end = event("f-dup", 3, kind="purged", audience=())
    for ev in (v1, v2, end):
        assert (await notify.ingest(ev)).outcome == pb.INGEST_OUTCOME_APPLIED
    await notify.settled()
    told = await _versions_told(notify, "alice", "f-dup")
    assert told == [1, 2]
    # Redelivered while their inbox rows are kept: duplicates.
    for ev in (v1, v2, end):
        assert (await notify.ingest(ev)).outcome == pb.INGEST_OUTCOME_DUPLICATE
    # Past the inbox's retention, not the retired row's: the retired row still says old.
    purged = await purge(
        sessions,
        read_older_than=WINDOW,
        inbox_older_than=WINDOW,
        retired_older_than=2 * WINDOW,
        now=utcnow() + WINDOW + DAY,
    )
    assert (purged.inbox_events, purged.retired_aggregates) == (3, 0)
    for ev in (v1, v2, end, event("f-dup", 1)):
        assert (await notify.ingest(ev)).outcome == pb.INGEST_OUTCOME_SKIPPED_OLD
    await notify.settled()
    assert await _versions_told(notify, "alice", "f-dup") == told
    row = await _row(sessions, "f-dup")
    assert row is not None and row.applied_version == 3 and row.retired_at is not None


async def test_a_retired_row_goes_only_after_the_window(notify, sessions) -> None:
    await notify.ingest(event("f-gone", 1))
    await notify.ingest(event("f-gone", 2, kind="purged", audience=()))
    await notify.ingest(event("f-live", 1))
    await notify.settled()
    # A parked event of the retired file (none can be parked after its retirement; one
    # left from before would be) goes with its row.
    stray = row_values(event("f-gone", 9), InboxStatus.PARKED, utcnow())
    async with sessions() as session, session.begin():
        await session.execute(insert(InboxEvent).values(**stray))
    table = {"table": "notify_aggregate_versions"}
    before = REGISTRY.get_sample_value("serentak_notify_purged_total", table) or 0
    for age in (timedelta(0), WINDOW - DAY):
        kept = await purge(
            sessions,
            read_older_than=WINDOW,
            inbox_older_than=10 * WINDOW,
            retired_older_than=WINDOW,
            now=utcnow() + age,
        )
        assert kept.retired_aggregates == 0
        assert await _row(sessions, "f-gone") is not None
    gone = await purge(
        sessions,
        read_older_than=WINDOW,
        inbox_older_than=10 * WINDOW,
        retired_older_than=WINDOW,
        now=utcnow() + WINDOW + DAY,
    )
    assert (gone.retired_aggregates, gone.inbox_events) == (1, 1)
    assert await _row(sessions, "f-gone") is None
    assert await _statuses(sessions, "f-gone") == {}
    # A live file's row stays however old it is.
    assert await _row(sessions, "f-live") is not None
    after = REGISTRY.get_sample_value("serentak_notify_purged_total", table)
    assert after - before == 1
    async with sessions() as session:
        left = await session.scalar(select(func.count()).select_from(AggregateVersion))
    assert left == 1


async def test_the_migration_keeps_existing_rows_live(database_url: str) -> None:
    notify_db.migrate(database_url)
    location, version_table = notify_db.MIGRATIONS, notify_db.VERSION_TABLE
    cfg = alembic_config(database_url, location, version_table)
    command.downgrade(cfg, "notify_0007")
    engine = create_engine(database_url)
    try:
        async with engine.begin() as conn:
            # The columns notify_0007 has: a row written before the upgrade.
            await conn.execute(
                insert(AggregateVersion).values(aggregate_id="f-old", applied_version=4)
            )
        command.upgrade(cfg, "head")
        sessions = session_factory(engine)
        async with sessions() as session, session.begin():
            row = await session.get(AggregateVersion, "f-old")
            assert row is not None and row.retired_at is None
            assert await lock_aggregate(session, "f-old") == 4
    finally:
        await engine.dispose()
