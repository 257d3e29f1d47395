"""The inbox rows an Ingest writes and reads: the event's row (insert-or-ignore), when it
accepts the event the aggregate's parked rows, read (PostgreSQL) in the insert's round
trip, and the final status of the parked rows the acceptance moves on.

PostgreSQL runs constant `text()` statements, built once: composing the Core construct
and computing its cache key on every call was most of an Ingest's SQLAlchemy CPU. They
are the SQL the construct compiled to. SQLite keeps the construct (no fused read there).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.driver_sql import DriverStatement
from services.notify.models import ID_LEN, InboxEvent, InboxStatus
from services.notify.sql import insert_ignore

# The event's row, nothing on a redelivery (ON CONFLICT on the primary key event_id).
_INSERT = """
INSERT INTO notify_inbox (event_id, aggregate_id, version, status, event, correlation_id,
                          received_at, finished_at)
VALUES (CAST(:event_id AS VARCHAR), CAST(:aggregate_id AS VARCHAR), CAST(:version AS BIGINT),
        CAST(:status AS VARCHAR), :event, CAST(:correlation_id AS VARCHAR),
        CAST(:received_at AS TIMESTAMP WITHOUT TIME ZONE),
        CAST(:finished_at AS TIMESTAMP WITHOUT TIME ZONE))
ON CONFLICT DO NOTHING
RETURNING notify_inbox.event_id
"""
PG_INSERT = text(_INSERT)  # public: bench_notify's durable floor stores it too

# Other transactions' accepted events of the aggregate still waiting for their job.
_BEHIND = f"""EXISTS (SELECT * FROM notify_inbox
        WHERE notify_inbox.aggregate_id = CAST(:aggregate_id AS VARCHAR)
          AND notify_inbox.status = '{InboxStatus.APPLIED}'
          AND notify_inbox.event_id != CAST(:event_id AS VARCHAR))"""


def _insert_and_read(behind: str) -> Any:
    # The insert's row first (`new`), then the aggregate's parked rows from the event's
    # version on, read in the statement's snapshot (which cannot hold the new row).
    return text(
        f"""
WITH ins AS ({_INSERT})
SELECT ins.event_id, CAST(NULL AS BIGINT) AS version, CAST(NULL AS BYTEA) AS event,
       CAST(NULL AS TIMESTAMP WITHOUT TIME ZONE) AS received_at, true AS "new",
       {behind} AS behind
FROM ins
UNION ALL
SELECT notify_inbox.event_id, notify_inbox.version, notify_inbox.event,
       notify_inbox.received_at, false AS "new", false AS behind
FROM notify_inbox
WHERE notify_inbox.aggregate_id = CAST(:aggregate_id AS VARCHAR)
  AND notify_inbox.status = '{InboxStatus.PARKED}'
  AND notify_inbox.version >= CAST(:version AS BIGINT)
"""
    )


_PG_INSERT_AND_READ = {
    check: DriverStatement(_insert_and_read(behind))
    for check, behind in ((True, _BEHIND), (False, "false"))
}


# Rows of the aggregate moved on by an accepting Ingest (parked successors accepted,
# events claiming an accepted version made old).
_PG_FINISH = text(
    """
UPDATE notify_inbox
SET status = CAST(:status AS VARCHAR),
    finished_at = CAST(:finished_at AS TIMESTAMP WITHOUT TIME ZONE)
WHERE notify_inbox.event_id = ANY(CAST(:event_ids AS VARCHAR[]))
"""
)


def row_values(event: events_pb2.Event, status: str, now: datetime) -> dict[str, Any]:
    """The inbox row of `event` stored with `status` at `now`."""
    return {
        "event_id": event.event_id,
        "aggregate_id": event.aggregate_id,
        "version": event.version,
        "status": status,
        "event": event.SerializeToString(deterministic=True),
        "correlation_id": event.correlation_id[:ID_LEN],
        "received_at": now,
        "finished_at": None if status == InboxStatus.PARKED else now,
    }


def pending_rows(aggregate_id: str, version: int) -> Any:
    """The aggregate's parked inbox rows from `version` on: what accepting `version`
    looks at (its parked successors, and other events claiming its version)."""
    i = InboxEvent
    return select(i.event_id, i.version, i.event, i.received_at).where(
        i.aggregate_id == aggregate_id,
        i.status == InboxStatus.PARKED,
        i.version >= version,
    )


async def waiting_for_job(session: AsyncSession, aggregate_id: str) -> bool:
    """Whether accepted events of the aggregate still wait for their fan-out job (rows
    `applied` by other transactions): PostgreSQL asks this in `insert_and_read`, SQLite
    here, before the new row is inserted."""
    found = await session.scalar(
        select(InboxEvent.event_id)
        .where(
            InboxEvent.aggregate_id == aggregate_id,
            InboxEvent.status == InboxStatus.APPLIED,
        )
        .limit(1)
    )
    return found is not None


async def insert_row(session: AsyncSession, values: dict[str, Any]) -> str | None:
    """Insert the inbox row `values` (`row_values`) unless its event_id is stored; the
    id when inserted, None for a duplicate."""
    if session.get_bind().dialect.name == "postgresql":
        stored: str | None = await session.scalar(PG_INSERT, values)
        return stored
    return await session.scalar(
        insert_ignore(session, InboxEvent).values(**values).returning(InboxEvent.event_id)
    )


async def insert_and_read(
    session: AsyncSession, values: dict[str, Any], *, check_behind: bool
) -> tuple[str | None, list[Any], bool]:
    """PostgreSQL: insert the inbox row `values` (as `insert_row`) and read `pending_rows`
    of its aggregate and version in one statement; the id the insert returned (None: a
    duplicate), those rows in order, and (with `check_behind`) whether accepted events
    of the aggregate other than this one still wait for their fan-out job."""
    stored: str | None = None
    behind = False
    rows: list[Any] = []
    for row in await _PG_INSERT_AND_READ[check_behind].rows(session, values):
        if row.new:
            stored, behind = row.event_id, bool(row.behind)
        else:
            rows.append(row)
    rows.sort(key=lambda r: (r.version, r.received_at, r.event_id))
    return stored, rows, behind


async def finish_rows(
    session: AsyncSession, event_ids: list[str], status: str, now: datetime
) -> None:
    """Give the inbox rows `event_ids` their final `status`, finished at `now`."""
    if session.get_bind().dialect.name == "postgresql":
        values = {"status": status, "finished_at": now, "event_ids": event_ids}
        await session.execute(_PG_FINISH, values)
        return
    await session.execute(
        update(InboxEvent)
        .where(InboxEvent.event_id.in_(event_ids))
        .values(status=status, finished_at=now)
    )
