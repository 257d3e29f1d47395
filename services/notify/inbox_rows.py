"""The inbox rows an accepting Ingest reads, and (PostgreSQL) their read fused with the
inbox insert into one round trip."""

from __future__ import annotations

from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import (
    BigInteger,
    DateTime,
    LargeBinary,
    String,
    and_,
    cast,
    literal,
    null,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from services.notify.models import InboxEvent, InboxStatus


def pending_rows(aggregate_id: str, version: int) -> Any:
    """The aggregate's inbox rows accepting `version` looks at: parked from `version`
    on, and accepted ones still waiting for their fan-out."""
    i = InboxEvent
    return select(i.event_id, i.version, i.status, i.event, i.received_at).where(
        i.aggregate_id == aggregate_id,
        or_(
            and_(i.status == InboxStatus.PARKED, i.version >= version),
            i.status == InboxStatus.APPLIED,
        ),
    )


async def insert_and_read(
    session: AsyncSession, insert: Any, event: events_pb2.Event
) -> tuple[str | None, list[Any]]:
    """PostgreSQL: run `insert` (RETURNING event_id) and read `pending_rows` in one
    statement; the id the insert returned (None: a duplicate) and those rows."""
    ins = insert.cte("ins")
    new = select(
        ins.c.event_id,
        cast(null(), BigInteger).label("version"),
        cast(null(), String).label("status"),
        cast(null(), LargeBinary).label("event"),
        cast(null(), DateTime).label("received_at"),
        literal(True).label("new"),
    )
    pending = pending_rows(event.aggregate_id, event.version).add_columns(
        literal(False).label("new")
    )
    stored: str | None = None
    rows: list[Any] = []
    for row in await session.execute(new.union_all(pending)):
        if row.new:
            stored = row.event_id
        else:
            rows.append(row)
    rows.sort(key=lambda r: (r.version, r.received_at, r.event_id))
    return stored, rows
