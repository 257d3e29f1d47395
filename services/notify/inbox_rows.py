"""The inbox rows an Ingest writes and reads: the event's row (insert-or-ignore), when it
accepts the event the aggregate's parked rows, read (PostgreSQL) in the insert's round
trip, and the final status of the parked rows the acceptance moves on.

Every statement is built once and run on the session's driver connection (`session_sql`,
`driver_sql`): composing the Core construct and computing its cache key on every call was
most of an Ingest's SQLAlchemy CPU. PostgreSQL's are constant `text()` statements (the SQL
the construct compiled to); SQLite's are the constructs (no fused read there).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import BigInteger, String, bindparam, select, text, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.driver_sql import DriverStatement
from services.common.session_sql import SessionStatement
from services.notify.models import ID_LEN, InboxEvent, InboxStatus

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


_I = InboxEvent.__table__.c
# The aggregate's parked inbox rows from `version` on, in acceptance order: what accepting
# `version` looks at (its parked successors, and other events claiming its version).
_PENDING = SessionStatement(
    select(_I.event_id, _I.version, _I.event, _I.received_at)
    .where(
        _I.aggregate_id == bindparam("aggregate_id", type_=String),
        _I.status == InboxStatus.PARKED,
        _I.version >= bindparam("version", type_=BigInteger),
    )
    .order_by(_I.version, _I.received_at, _I.event_id)
)
_WAITING = SessionStatement(
    select(_I.event_id)
    .where(
        _I.aggregate_id == bindparam("aggregate_id", type_=String),
        _I.status == InboxStatus.APPLIED,
    )
    .limit(1)
)
_INSERT_ROW = SessionStatement(
    {
        "postgresql": PG_INSERT,
        "sqlite": sqlite.insert(InboxEvent).on_conflict_do_nothing().returning(_I.event_id),
    }
)


async def pending_rows(session: AsyncSession, aggregate_id: str, version: int) -> list[Any]:
    """The aggregate's parked inbox rows from `version` on (event_id, version, event,
    received_at), in the order accepting `version` takes them."""
    return await _PENDING.rows(session, {"aggregate_id": aggregate_id, "version": version})


async def waiting_for_job(session: AsyncSession, aggregate_id: str) -> bool:
    """Whether accepted events of the aggregate still wait for their fan-out job (rows
    `applied` by other transactions): PostgreSQL asks this in `insert_and_read`, SQLite
    here, before the new row is inserted."""
    return await _WAITING.first(session, {"aggregate_id": aggregate_id}) is not None


async def insert_row(session: AsyncSession, values: dict[str, Any]) -> str | None:
    """Insert the inbox row `values` (`row_values`) unless its event_id is stored; the
    id when inserted, None for a duplicate."""
    row = await _INSERT_ROW.first(session, values)
    return None if row is None else str(row[0])


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
