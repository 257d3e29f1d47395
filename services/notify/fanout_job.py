"""The fan-out job: turns accepted events into notifications, on the job runtime.

Ingest (`inbox.py`) only decides *whether and when* an event applies: it stores the
event, checks its version and, once its turn has come, enqueues one fan-out job for it in
the same transaction. This job does the per-user work.

Partitioning: by file (`partition_key = notify-file:{aggregate_id}`). Why not by user?
One event reaches 100 to 1,000 users; per-user jobs would mean that many claims, idempotency
records and transactions per event, while the runtime runs a few hundred jobs/s — one
rename to 1,000 users would queue seconds of work. A per-file job writes all of the
event's notifications in one transaction with multi-row statements instead, and the two
orders the issue asks for still hold:
- per file: a file's jobs run one at a time, and each writes the oldest accepted events
  first, so notifications are written in version order; digest folding relies on it (it
  looks at the user's latest notification for the file);
- per user: every notification takes the next `seq` of its user's stream row, locked until
  commit (users locked in sorted order, so concurrent jobs of different files sharing users
  cannot deadlock). A user's notifications and badge therefore change one commit at a
  time, in `seq` order, whichever files they come from.

One job per accepting transaction, not per event. A job writes the file's oldest
accepted, not yet notified events, in version order, in one transaction (at most
`max_batch`; when more are waiting it enqueues a continuation job in that transaction).
So Ingest queues one job for all the events of a file one transaction accepts (an
IngestBatch of 100 events: one job, not 100 claims of a single-file partition that runs
them one at a time), and a job that finds its events already written by an earlier job
finishes with no effect. Whenever accepted events wait, a job that will see them is
queued: the one their accepting transaction queued, or a continuation.

A file's job that is still waiting to be claimed absorbs later ones (the runtime's
`dedupe_key`, window 0): under a burst the file's partition runs one job per claim.

Exactly once. The runtime records the job's idempotency key with its effects; the inbox
rows go `applied -> notified` in the same transaction, read under row locks, so a
redelivered or replayed job, or a job whose events an earlier one already wrote, changes
nothing. UNIQUE (tenant, user, file, version) backs it up.

Live delivery. What the transaction wrote is handed to the in-process `Broker` only after
it commits (`fanout_writer.py`), so a stream never shows an uncommitted row.

Not every accepted event comes here: on PostgreSQL, Ingest writes a small audience's
notifications in its own transaction (`inbox.py`, "Inline fan-out"); a job is queued for
big audiences, digest folds, SQLite, and whenever an earlier event of the file still
waits for its job.
"""

from __future__ import annotations

from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from services.common import tracing
from services.common.jobs import (
    ConflictError,
    JobContext,
    NewJob,
    PermanentError,
    RetryPolicy,
    enqueue,
)
from services.common.logging import get_logger
from services.notify.fanout_writer import FanOutWriter
from services.notify.models import ID_LEN, InboxEvent, InboxStatus
from services.notify.sql import retryable

log = get_logger(__name__)

FANOUT_JOB = "notify_fanout"
# Deadlocks and serialization failures are retried fast: the partition waits meanwhile.
FANOUT_RETRY = RetryPolicy(max_attempts=10, base_seconds=0.05, cap_seconds=5.0)


def fanout_job(event: events_pb2.Event, *, continuation: bool = False) -> NewJob:
    """The fan-out job for an accepted `event` and the file's events accepted with or
    after it (enqueue it in the accepting transaction). A continuation (queued by a job
    that left accepted events behind) has a key of its own, so it never stands in for
    the job the event's accepting transaction queued."""
    return NewJob(
        job_type=FANOUT_JOB,
        payload={
            "event_id": event.event_id,
            "aggregate_id": event.aggregate_id,
            "version": event.version,
        },
        partition_key=f"notify-file:{event.aggregate_id}",
        idempotency_key=f"{'fanout-next' if continuation else 'fanout'}:{event.event_id}",
        # While a file's job waits unclaimed, later ones fold into it (it will write their
        # events too: a job writes all the file's accepted events), so a busy file's
        # single partition runs one job per claim, not one per accepting transaction.
        dedupe_key=f"notify-file:{event.aggregate_id}",
        correlation_id=event.correlation_id[:ID_LEN] or None,
    )


class FanOutHandler:
    """Job handler: write the notifications of an accepted event (and its accepted
    successors), then publish them to open streams after commit."""

    def __init__(self, writer: FanOutWriter, *, max_batch: int) -> None:
        self._writer = writer
        self._max_batch = max_batch

    async def __call__(self, ctx: JobContext) -> None:
        """Run one fan-out job inside the job's transaction (see the module docstring)."""
        try:
            ctx.effect = await self._fan_out(ctx.session, ctx.payload)
        except DBAPIError as exc:
            if retryable(exc):
                # PostgreSQL broke a deadlock or serialization conflict: nothing happened.
                raise ConflictError(f"transaction aborted by the database: {exc.orig}") from exc
            raise

    async def _fan_out(self, session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            str(payload["event_id"])
            aggregate_id = str(payload["aggregate_id"])
            int(payload["version"])
        except (KeyError, TypeError, ValueError) as exc:
            raise PermanentError(f"not a fan-out payload: {payload!r}") from exc
        chain = await self._accepted(session, aggregate_id)
        if not chain:
            # Written by an earlier job (or a concurrent one after a lost lease).
            return {"events": 0, "already_notified": True}
        waiting = chain[self._max_batch :]
        chain = chain[: self._max_batch]
        # The job runs in its first event's trace; the chain's other events' traces get
        # a span of the write too.
        with tracing.in_own_traces(
            [ev.traceparent for ev in chain], "notify fanout_event", fanout="job"
        ):
            fanned = await self._writer.write(session, chain)
        if waiting:
            await enqueue(session, fanout_job(waiting[0], continuation=True))
        self._writer.publish_after_commit(session, fanned, chain)
        return {"events": len(chain), "notifications": fanned.stored}

    async def _accepted(self, session: AsyncSession, aggregate_id: str) -> list[events_pb2.Event]:
        """The file's oldest accepted, not yet notified events, in version order (at most
        `max_batch` + 1: the extra one says more are waiting), row-locked (PostgreSQL
        re-checks the status after waiting for a lock)."""
        rows = await session.execute(
            select(InboxEvent.event)
            .where(
                InboxEvent.aggregate_id == aggregate_id,
                InboxEvent.status == InboxStatus.APPLIED,
            )
            .order_by(InboxEvent.version)
            .limit(self._max_batch + 1)
            .with_for_update()
        )
        chain = []
        for (payload,) in rows:
            ev = events_pb2.Event()
            ev.ParseFromString(payload)
            chain.append(ev)
        return chain
