"""The inbox rows an accepting Ingest reads, and (PostgreSQL) their read fused with the
inbox insert into one round trip."""

from __future__ import annotations

from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import (
    BigInteger,
    DateTime,
    LargeBinary,
    cast,
    exists,
    false,
    literal,
    null,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from services.notify.models import InboxEvent, InboxStatus


def pending_rows(aggregate_id: str, version: int) -> Any:
    """The aggregate's parked inbox rows from `version` on: what accepting `version`
    looks at (its parked successors, and other events claiming its version)."""
    i = InboxEvent
    return select(i.event_id, i.version, i.event, i.received_at).where(
        i.aggregate_id == aggregate_id,
        i.status == InboxStatus.PARKED,
        i.version >= version,
    )


async def insert_and_read(
    session: AsyncSession, insert: Any, event: events_pb2.Event, *, check_behind: bool
) -> tuple[str | None, list[Any], bool]:
    """PostgreSQL: run `insert` (RETURNING event_id) and read `pending_rows` in one
    statement; the id the insert returned (None: a duplicate), those rows in order, and
    (with `check_behind`) whether accepted events of the aggregate other than this one
    still wait for their fan-out job."""
    i = InboxEvent
    ins = insert.cte("ins")
    waiting = (
        exists()
        .where(
            i.aggregate_id == event.aggregate_id,
            i.status == InboxStatus.APPLIED,
            i.event_id != event.event_id,
        )
        .correlate(None)
        if check_behind
        else false()
    )
    new = select(
        ins.c.event_id,
        cast(null(), BigInteger).label("version"),
        cast(null(), LargeBinary).label("event"),
        cast(null(), DateTime).label("received_at"),
        literal(True).label("new"),
        waiting.label("behind"),
    )
    pending = pending_rows(event.aggregate_id, event.version).add_columns(
        literal(False).label("new"), false().label("behind")
    )
    stored: str | None = None
    behind = False
    rows: list[Any] = []
    for row in await session.execute(new.union_all(pending)):
        if row.new:
            stored, behind = row.event_id, bool(row.behind)
        else:
            rows.append(row)
    rows.sort(key=lambda r: (r.version, r.received_at, r.event_id))
    return stored, rows, behind
