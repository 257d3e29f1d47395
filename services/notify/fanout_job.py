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
it commits (an `after_commit` hook), so a stream never shows an uncommitted row.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import event as sa_event
from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import SessionTransaction

from services.common.jobs import (
    ConflictError,
    JobContext,
    NewJob,
    PermanentError,
    RetryPolicy,
    enqueue,
)
from services.common.logging import get_logger
from services.notify import fanout_batch, metrics
from services.notify.clock import to_naive_utc, utcnow
from services.notify.fanout import Written, audience, fan_out, lock_streams
from services.notify.models import ID_LEN, InboxEvent, InboxStatus
from services.notify.sql import retryable
from services.notify.streams import Broker
from services.notify.summaries import describe

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

    def __init__(self, broker: Broker, *, digest_window: timedelta, max_batch: int) -> None:
        self._broker = broker
        self._window = digest_window
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
        written, duplicates = await self._write(session, chain)
        if waiting:
            await enqueue(session, fanout_job(waiting[0], continuation=True))
        self._publish_after_commit(session, written, duplicates, len(chain))
        return {"events": len(chain), "notifications": len(written)}

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

    async def _write(
        self, session: AsyncSession, chain: list[events_pb2.Event]
    ) -> tuple[list[Written], int]:
        described = [describe(ev) for ev in chain]
        if fanout_batch.batchable(session, described):
            # PostgreSQL, nothing to fold: the whole chain in two statements.
            # It also marks the chain notified.
            occurred = [self._occurred_at(ev) for ev in chain]
            return await fanout_batch.fan_out_chain(session, chain, described, occurred, utcnow())
        if len(chain) > 1:
            # Every user this transaction will notify, locked up front in one global
            # order (a single event's seq upsert already visits its users sorted).
            audiences: dict[str, set[str]] = {}
            for ev in chain:
                audiences.setdefault(ev.tenant_id, set()).update(audience(ev))
            for tenant_id, users in sorted(audiences.items()):
                await lock_streams(session, tenant_id, sorted(users))
        written: list[Written] = []
        duplicates = 0
        for ev, description in zip(chain, described, strict=True):
            fanned = await fan_out(
                session,
                ev,
                description,
                occurred_at=self._occurred_at(ev),
                now=utcnow(),
                window=self._window,
            )
            written.extend(fanned.written)
            duplicates += fanned.duplicates
        await session.execute(
            update(InboxEvent)
            .where(InboxEvent.event_id.in_([ev.event_id for ev in chain]))
            .values(status=InboxStatus.NOTIFIED)
        )
        return written, duplicates

    @staticmethod
    def _occurred_at(ev: events_pb2.Event) -> datetime:
        if ev.HasField("occurred_at"):
            return to_naive_utc(ev.occurred_at.ToDatetime())
        return utcnow()

    def _publish_after_commit(
        self, session: AsyncSession, written: list[Written], duplicates: int, events: int
    ) -> None:
        ended = self._broker.committing(written)
        outcome = {"committed": False, "ended": False}

        def committed(_session: object) -> None:
            outcome["committed"] = True
            metrics.NOTIFICATIONS_WRITTEN.inc(len(written))
            metrics.DIGESTS_MERGED.inc(sum(1 for w in written if w.merged))
            metrics.FANOUT_EVENTS.inc(events)
            if duplicates:
                metrics.DUPLICATES_PREVENTED.labels("notification").inc(duplicates)

        def transaction_ended(_session: object, transaction: SessionTransaction) -> None:
            if transaction.parent is None and not outcome["ended"]:
                outcome["ended"] = True
                # Publishes when committed; a rollback (lost lease, lost idempotency race)
                # publishes nothing.
                ended(outcome["committed"])

        # The runtime commits after the handler returns (with the idempotency record).
        sa_event.listen(session.sync_session, "after_commit", committed, once=True)
        sa_event.listen(session.sync_session, "after_transaction_end", transaction_ended)
