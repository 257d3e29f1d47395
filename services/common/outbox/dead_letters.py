"""Outbox dead letters: an event its subscriber refuses for good leaves the queue.

A publish that fails with a permanent gRPC status (the subscriber says the event itself
is wrong: INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED, OUT_OF_RANGE,
UNIMPLEMENTED) is never retried by the relay: retrying cannot succeed, and it would hold
back every later event of the aggregate forever. Instead, in one transaction, the event
moves from `outbox_events` to the runtime's `dead_letters` table as a job of type
`outbox.publish` whose payload carries the serialized event. So the existing AdminService
RPCs and admin CLI list, replay and purge it like any dead job, QueueStats counts it, and
`serentak_outbox_dead_letters_total` counts it as it happens.

Replaying runs the `outbox.publish` job, which puts the event back into the outbox with
the same `event_id` (subscribers deduplicate by it); the relay then publishes it like a
new one. Transient statuses (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ...) and
any other exception keep the old behaviour: the aggregate waits and retries with backoff.

What happens to the aggregate's later events (the order-versus-progress choice): the
relay goes on publishing them, and the subscriber decides. Notify keeps per-file order:
it parks versions after the missing one (visible in `serentak_notify_parked_*`) until the
dead letter is replayed, so nobody sees v6 before v5. Replay once the cause is fixed.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import grpc
from serentak.events.v1 import events_pb2
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.job import JobContext
from services.common.jobs.models import dead_letters, utcnow
from services.common.outbox.models import outbox_events
from services.common.outbox.store import record_event

OUTBOX_PUBLISH_JOB = "outbox.publish"

# The subscriber refused the event itself: sending it again cannot succeed.
PERMANENT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def is_permanent(exc: BaseException) -> bool:
    """True when `exc` is a gRPC status that no retry of the same event can change."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in PERMANENT_CODES


def _describe(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"grpc.StatusCode.{exc.code().name}", exc.details() or ""
    return f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc)


async def dead_letter_event(
    session: AsyncSession,
    row_id: int,
    event: events_pb2.Event,
    exc: BaseException,
    relay_id: str,
) -> None:
    """Move outbox row `row_id` (holding `event`) to `dead_letters`, in the caller's
    transaction (the relay's, while its lease on the aggregate is still held)."""
    now = utcnow()
    created = await session.scalar(
        select(outbox_events.c.created_at).where(outbox_events.c.id == row_id)
    )
    error_type, message = _describe(exc)
    payload: dict[str, Any] = {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "version": event.version,
        "event": base64.b64encode(event.SerializeToString(deterministic=True)).decode(),
    }
    await session.execute(
        insert(dead_letters).values(
            job_id=str(uuid.uuid4()),
            job_type=OUTBOX_PUBLISH_JOB,
            partition_key=f"{event.aggregate_type}:{event.aggregate_id}"[:255],
            # Unique per dead-lettering: a replayed event that fails again can replay again.
            idempotency_key=f"{OUTBOX_PUBLISH_JOB}:{event.event_id}:{uuid.uuid4().hex[:12]}",
            payload=payload,
            correlation_id=event.correlation_id,
            error_class="permanent",
            error_type=error_type,
            error_message=message[:4000],
            traceback="",
            attempts=1,
            worker_id=relay_id,
            first_attempt_at=now,
            last_attempt_at=now,
            enqueued_at=created or now,
            dead_at=now,
        )
    )
    await session.execute(delete(outbox_events).where(outbox_events.c.id == row_id))


async def republish(ctx: JobContext) -> None:
    """The `outbox.publish` job (a replayed dead letter): put the event back in the outbox."""
    event = events_pb2.Event.FromString(base64.b64decode(ctx.payload["event"]))
    waiting = await ctx.session.scalar(
        select(outbox_events.c.id).where(outbox_events.c.event_id == event.event_id)
    )
    if waiting is None:
        await record_event(ctx.session, event)
    ctx.effect = {"event_id": event.event_id, "requeued": waiting is None}
