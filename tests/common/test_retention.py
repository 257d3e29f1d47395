"""The runtime_retention job (services/common/retention.py): published outbox events,
applied-job records, dead letters and audit rows past their retention are deleted, in
batches; unpublished events and younger rows stay; the periodic job does it with the
service's settings, and every deleted row is counted. SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from serentak.events.v1 import events_pb2
from sqlalchemy import func, insert, select, update

from services.common import audit
from services.common.audit.models import audit_events
from services.common.config import CommonSettings
from services.common.jobs import JobRegistry, PeriodicScheduler, Worker
from services.common.jobs.models import applied_jobs, dead_letters, utcnow
from services.common.outbox.models import outbox_events
from services.common.outbox.store import record_event
from services.common.retention import (
    BATCH,
    RUNTIME_RETENTION_JOB,
    RuntimeRetention,
    purge_runtime,
    register_runtime_retention,
)

DAY = timedelta(days=1)
TABLES = {
    "outbox_events": outbox_events,
    "applied_jobs": applied_jobs,
    "dead_letters": dead_letters,
    "audit_events": audit_events,
}


def _purged(table: str) -> float:
    return REGISTRY.get_sample_value("serentak_rows_purged_total", {"table": table}) or 0.0


async def _count(sessions, table) -> int:  # type: ignore[no-untyped-def]
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(table)) or 0)


async def _seed(sessions, *, old: int, young: int, unpublished_old: int) -> None:  # type: ignore[no-untyped-def]
    """`old` rows 10 days old and `young` rows of now in every table, plus old events
    the relay never published."""
    now = utcnow()
    async with sessions.begin() as session:
        for i in range(old + young + unpublished_old):
            at = now - 10 * DAY if i < old or i >= old + young else now
            published = at if i < old + young else None
            await record_event(
                session,
                events_pb2.Event(
                    event_id=uuid.uuid4().hex,
                    event_type="file.renamed",
                    aggregate_type="file",
                    aggregate_id=f"f{i}",
                    version=1,
                ),
            )
            await session.execute(
                update(outbox_events)
                .where(outbox_events.c.aggregate_id == f"f{i}")
                .values(created_at=at, published_at=published)
            )
        rows = [(now - 10 * DAY if i < old else now) for i in range(old + young)]
        await session.execute(
            insert(applied_jobs),
            [
                {
                    "idempotency_key": f"k{i}",
                    "job_type": "t",
                    "job_id": uuid.uuid4().hex,
                    "effect": None,
                    "applied_at": at,
                }
                for i, at in enumerate(rows)
            ],
        )
        await session.execute(
            insert(dead_letters),
            [
                {
                    "job_id": uuid.uuid4().hex,
                    "job_type": "t",
                    "partition_key": "p",
                    "idempotency_key": f"d{i}",
                    "payload": {},
                    "correlation_id": "c",
                    "error_class": "permanent",
                    "error_type": "E",
                    "error_message": "m",
                    "traceback": "",
                    "attempts": 1,
                    "worker_id": "w",
                    "enqueued_at": at,
                    "dead_at": at,
                }
                for i, at in enumerate(rows)
            ],
        )
        for i, at in enumerate(rows):
            await audit.record(
                session,
                tenant_id="acme",
                principal="alice",
                action="file.shared",
                target_type="file",
                target_id=f"a{i}",
            )
            await session.execute(
                update(audit_events).where(audit_events.c.target_id == f"a{i}").values(at=at)
            )


async def test_rows_past_retention_go_and_the_rest_stay(runtime_db) -> None:  # type: ignore[no-untyped-def]
    sessions = runtime_db.sessions
    await _seed(sessions, old=7, young=3, unpublished_old=2)
    before = {t: _purged(t) for t in TABLES}
    policy = RuntimeRetention(
        outbox_seconds=DAY.total_seconds(),
        applied_jobs_seconds=DAY.total_seconds(),
        dead_letter_seconds=DAY.total_seconds(),
        audit_seconds=DAY.total_seconds(),
    )
    purged = await purge_runtime(sessions, policy)
    assert purged.rows == {t: 7 for t in TABLES}
    assert {t: _purged(t) - before[t] for t in TABLES} == {t: 7 for t in TABLES}
    # The young rows stay, and so do the old events nobody published yet.
    assert await _count(sessions, outbox_events) == 3 + 2
    async with sessions() as session:
        left = await session.scalar(
            select(func.count()).where(outbox_events.c.published_at.is_(None))
        )
    assert left == 2
    for table in (applied_jobs, dead_letters, audit_events):
        assert await _count(sessions, table) == 3
    # A second run finds nothing; a later one takes the rest (still not the unpublished).
    assert set((await purge_runtime(sessions, policy)).rows.values()) == {0}
    later = await purge_runtime(sessions, policy, now=utcnow() + 2 * DAY)
    assert later.rows == {t: 3 for t in TABLES}
    assert await _count(sessions, outbox_events) == 2


async def test_a_backlog_larger_than_a_batch_is_drained_in_one_run(runtime_db) -> None:  # type: ignore[no-untyped-def]
    sessions = runtime_db.sessions
    old = utcnow() - 10 * DAY
    async with sessions.begin() as session:
        await session.execute(
            insert(applied_jobs),
            [
                {"idempotency_key": f"k{i}", "job_type": "t", "job_id": "j", "applied_at": old}
                for i in range(2 * BATCH + 3)
            ],
        )
    purged = await purge_runtime(sessions, RuntimeRetention(applied_jobs_seconds=60))
    assert purged.rows["applied_jobs"] == 2 * BATCH + 3
    assert await _count(sessions, applied_jobs) == 0


async def test_the_periodic_job_purges_with_the_services_settings(runtime_db) -> None:  # type: ignore[no-untyped-def]
    sessions = runtime_db.sessions
    await _seed(sessions, old=4, young=0, unpublished_old=1)
    settings = CommonSettings(
        outbox_retention_seconds=3600,
        applied_jobs_retention_seconds=3600,
        dead_letter_retention_seconds=3600,
        audit_retention_seconds=3600,
        runtime_retention_interval_seconds=60,
    )
    registry = JobRegistry()
    schedule = register_runtime_retention(registry, settings)
    assert schedule.job_type == RUNTIME_RETENTION_JOB
    scheduler = PeriodicScheduler(sessions, [schedule], scheduler_id="s")
    assert await scheduler.run_due() == [RUNTIME_RETENTION_JOB]
    worker = Worker(sessions, registry, worker_id="w")
    while await worker.run_once():
        pass
    # Its own applied record is young: the only row left in applied_jobs.
    async with sessions() as session:
        keys = (await session.execute(select(applied_jobs.c.idempotency_key))).scalars().all()
        effect = await session.scalar(select(applied_jobs.c.effect))
    assert [k.startswith(f"periodic:{RUNTIME_RETENTION_JOB}:") for k in keys] == [True]
    assert effect == {t: 4 for t in TABLES}
    assert await _count(sessions, outbox_events) == 1  # the unpublished one
    assert await _count(sessions, dead_letters) == 0
    assert await _count(sessions, audit_events) == 0


def test_applied_records_outlive_dead_letters() -> None:
    with pytest.raises(ValueError, match="applied_jobs_retention_seconds"):
        CommonSettings(applied_jobs_retention_seconds=60, dead_letter_retention_seconds=3600)
