"""Writing events to the outbox, in the caller's transaction, and reading them back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import Integer, String, bindparam, func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.common import write_behind
from services.common.correlation import current_correlation_id
from services.common.jobs.models import utcnow
from services.common.outbox.models import outbox_events
from services.common.session_sql import SessionStatement, SessionStatements
from services.common.tracing import current_traceparent

# Built once (its values passed at execution): a statement made per call costs more than
# running it. Rows nothing reads back in the transaction: written behind in a group commit.
_ROWS = write_behind.Rows(SessionStatement(insert(outbox_events)))


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """One unpublished row: its order id, the event to publish and the traceparent it
    was recorded under (None: untraced)."""

    id: int
    event: events_pb2.Event
    traceparent: str | None = None


async def record_event(session: AsyncSession, event: events_pb2.Event) -> None:
    """Write `event` to the outbox in the caller's transaction.

    A rollback leaves no event; a commit always leaves one, published later by the relay
    in order per aggregate, in the trace of the span current now (when tracing is on). An
    empty correlation_id or occurred_at is filled in (from the bound correlation id and
    now) on a copy; the caller's message is not modified. In a group commit the row is
    written behind, with the group's others (`write_behind`): ids still follow the order
    events were recorded in.
    """
    for name in ("event_id", "event_type", "aggregate_type", "aggregate_id"):
        if not getattr(event, name):
            raise ValueError(f"event.{name} is required")
    stored = events_pb2.Event()
    stored.CopyFrom(event)
    if not stored.correlation_id:
        stored.correlation_id = current_correlation_id()
    now = utcnow()
    if not stored.HasField("occurred_at"):
        stored.occurred_at.FromDatetime(now)
    await write_behind.write(
        session,
        _ROWS,
        {
            "event_id": stored.event_id,
            "aggregate_type": stored.aggregate_type,
            "aggregate_id": stored.aggregate_id,
            "version": stored.version,
            "event_type": stored.event_type,
            "event": stored.SerializeToString(deterministic=True),
            "correlation_id": stored.correlation_id,
            "traceparent": current_traceparent(),
            "created_at": now,
        },
    )


_PENDING = SessionStatement(
    select(outbox_events.c.aggregate_type, outbox_events.c.aggregate_id)
    .where(outbox_events.c.published_at.is_(None))
    .group_by(outbox_events.c.aggregate_type, outbox_events.c.aggregate_id)
    .order_by(func.min(outbox_events.c.id))
    .limit(bindparam("limit", type_=Integer))
)


async def pending_aggregates(session: AsyncSession, limit: int) -> list[tuple[str, str]]:
    """Aggregates with unpublished events, the one waiting longest first."""
    return [(t, i) for t, i in await _PENDING.rows(session, {"limit": limit})]


async def unpublished_events(
    session: AsyncSession, aggregate_type: str, aggregate_id: str, limit: int
) -> list[OutboxEvent]:
    """The aggregate's unpublished events in the order they were recorded, each carrying
    the traceparent stored with it (`Event.traceparent`)."""
    stmt = (
        select(outbox_events.c.id, outbox_events.c.event, outbox_events.c.traceparent)
        .where(
            outbox_events.c.aggregate_type == aggregate_type,
            outbox_events.c.aggregate_id == aggregate_id,
            outbox_events.c.published_at.is_(None),
        )
        .order_by(outbox_events.c.id)
        .limit(limit)
    )
    return [
        _outbox_event(row_id, blob, traceparent)
        for row_id, blob, traceparent in await session.execute(stmt)
    ]


async def unpublished_events_of(
    session: AsyncSession, aggregates: list[tuple[str, str]], limit: int
) -> list[tuple[str, str, OutboxEvent]]:
    """The first `limit` unpublished events of any of `aggregates`, in the order they were
    recorded, each with its (aggregate_type, aggregate_id): one relay round's read. A cut
    at `limit` keeps each aggregate's events a prefix of its unpublished ones."""
    if not aggregates:
        return []
    values: dict[str, Any] = {"limit": limit}
    for i, (aggregate_type, aggregate_id) in enumerate(aggregates):
        values[f"type_{i}"], values[f"id_{i}"] = aggregate_type, aggregate_id
    return [
        (aggregate_type, aggregate_id, _outbox_event(row_id, blob, traceparent))
        for aggregate_type, aggregate_id, row_id, blob, traceparent in await _EVENTS_OF.of_padded(
            values, ("type", "id"), len(aggregates)
        ).rows(session, values)
    ]


def _events_of(count: int) -> Any:
    """The first `:limit` unpublished events of `count` aggregates (`type_i`, `id_i`)."""
    c = outbox_events.c
    aggregates = [
        tuple_(bindparam(f"type_{i}", type_=String), bindparam(f"id_{i}", type_=String))
        for i in range(count)
    ]
    return (
        select(c.aggregate_type, c.aggregate_id, c.id, c.event, c.traceparent)
        .where(tuple_(c.aggregate_type, c.aggregate_id).in_(aggregates), c.published_at.is_(None))
        .order_by(c.id)
        .limit(bindparam("limit", type_=Integer))
    )


_EVENTS_OF = SessionStatements(_events_of)


def _outbox_event(row_id: int, blob: bytes, traceparent: str | None) -> OutboxEvent:
    """A stored row as it is published: the event with the traceparent it was recorded
    under, if any (`Event.traceparent`)."""
    event = events_pb2.Event.FromString(blob)
    if traceparent:
        event.traceparent = traceparent
    return OutboxEvent(row_id, event, traceparent)


async def oldest_unpublished(session: AsyncSession) -> tuple[int, datetime | None]:
    """(number of unpublished events, created_at of the oldest one)."""
    stmt = select(func.count(), func.min(outbox_events.c.created_at)).where(
        outbox_events.c.published_at.is_(None)
    )
    count, oldest = (await session.execute(stmt)).one()
    if isinstance(oldest, str):  # SQLite aggregates lose the column type
        oldest = datetime.fromisoformat(oldest).replace(tzinfo=utcnow().tzinfo)
    elif oldest is not None and oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=utcnow().tzinfo)
    return int(count), oldest


async def mark_many_published(session: AsyncSession, row_ids: list[int]) -> None:
    """Set published_at of `row_ids` (only once: a republish after a crash keeps the first
    mark), in one statement."""
    if row_ids:
        values: dict[str, Any] = {f"id_{i}": row_id for i, row_id in enumerate(row_ids)}
        values["at"] = utcnow()
        await _MARK.of_padded(values, ("id",), len(row_ids)).execute(session, values)


_MARK = SessionStatements(
    lambda n: (
        update(outbox_events)
        .where(
            outbox_events.c.id.in_([bindparam(f"id_{i}", type_=Integer) for i in range(n)]),
            outbox_events.c.published_at.is_(None),
        )
        .values(published_at=bindparam("at", type_=outbox_events.c.published_at.type))
    )
)
