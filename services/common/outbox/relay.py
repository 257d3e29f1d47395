"""The outbox relay: publish unpublished events in order per aggregate, then mark them.

Per aggregate: take its relay lease (so one relay at a time publishes it, across
replicas), then for each unpublished event in id order: publish to every subscriber,
renew the lease, mark published. A crash between publish and mark republishes the event
on the next run: subscribers deduplicate by event_id. A failed publish stops that
aggregate (later events must not overtake it) and retries after a growing delay, unless
the subscriber refused the event for good: then it goes to the dead letters and the
aggregate goes on (`dead_letters.py`).

Batches. When every subscriber takes batches (`publish_many`), a round's pending events
(up to `batch_size`, of every due aggregate, in the order they were recorded) go in one
call per subscriber and are marked in one transaction: many files' events cost one round
trip and a few statements a round, not five transactions a file. Any failure of a batch
falls back to publishing its events one by one, each aggregate alone, which retries,
backs off or dead-letters exactly as before (republishing is safe: subscribers deduplicate
by event_id).

Write transactions. Every transaction that takes, renews or gives up leases and marks
events runs through `writes`: by default a transaction of its own. On SQLite, in a service
with a group committer (services/common/group_commit.py), a unit of its next group: the
relay's bookkeeping then shares the COMMIT (one WAL fsync, one turn of the one write lock)
with the writes committing at the moment, instead of taking the lock and paying an fsync
twice a round. Not on PostgreSQL: there a unit's lease rows would stay locked while the
rest of its group runs, and two replicas' groups, each holding some of them, could wait on
each other; short transactions of its own cannot. A unit may run again after another
unit's failure, and is the same when it does (leases taken anew, marks and releases
idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from serentak.events.v1 import events_pb2
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import tracing
from services.common.correlation import bound_correlation_id, usable
from services.common.db import read_only
from services.common.jobs import metrics
from services.common.logging import get_logger
from services.common.outbox import leases
from services.common.outbox.bookkeeping import (
    dead_letter_under_lease,
    mark_under_lease,
    settle_round,
    take_round,
)
from services.common.outbox.dead_letters import is_permanent
from services.common.outbox.store import OutboxEvent, pending_aggregates, unpublished_events
from services.common.outbox.subscribers import Subscriber, send_batch

log = get_logger(__name__)

T = TypeVar("T")
# Runs one unit of write work in a committed transaction: its result once committed.
Writes = Callable[[Callable[[AsyncSession], Awaitable[Any]]], Awaitable[Any]]

DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_POLL_SECONDS = 0.5
# Backoff after a failed publish, per aggregate: 0.5 s doubling up to 60 s.
RETRY_BASE_SECONDS = 0.5
RETRY_CAP_SECONDS = 60.0


class Relay:
    """Publishes the outbox to `subscribers` until cancelled."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        subscribers: Sequence[Subscriber],
        *,
        relay_id: str,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        poll_interval: float = DEFAULT_POLL_SECONDS,
        batch_size: int = 100,
        concurrency: int = 4,
        writes: Writes | None = None,
        gather_seconds: float = 0.0,
    ) -> None:
        self.sessions = sessions
        # The relay's write transactions (module docstring, "Write transactions").
        self._writes: Writes = writes or self._own_transaction
        self.subscribers = list(subscribers)
        self.relay_id = relay_id
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.batch_size = batch_size
        self.concurrency = concurrency
        # Woken by a commit, wait this long for others': one round publishes them all.
        self.gather_seconds = gather_seconds
        # aggregate key -> (failures so far, monotonic time before which we do not retry)
        self._backoff: dict[str, tuple[int, float]] = {}
        self._wake = asyncio.Event()
        self._cut = False  # the last round left events for the next (hit `batch_size`)

    async def _own_transaction(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        async with self.sessions() as session, session.begin():
            return await work(session)

    async def _write(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        result: T = await self._writes(work)
        return result

    def wake(self) -> None:
        """Look for events now instead of at the next poll."""
        self._wake.set()

    async def run(self) -> None:
        """Publish forever. A round sees what was committed before it began; a round cut
        short by `batch_size` starts the next at once; else the next starts on a wake (a
        commit since the round began), `gather_seconds` after it, or after `poll_interval`
        (commits it is not told of)."""
        log.info("relay_started", relay_id=self.relay_id)
        while True:
            self._wake.clear()  # from here on, a commit wakes the next round
            try:
                published = await self.publish_pending()
            except Exception:
                log.exception("relay_round_failed", relay_id=self.relay_id)
                published = 0
            if published and self._cut:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()
            if self.gather_seconds and self._wake.is_set():
                await asyncio.sleep(self.gather_seconds)  # a window, not a wait for a state

    async def publish_pending(self) -> int:
        """One round over the aggregates with unpublished events; returns events published.

        The round takes every due aggregate's lease and reads their events in one
        transaction, sends the events (one: `publish`; more: one batch per subscriber), and
        marks them, renewing and releasing the leases, in one more: a small file's event
        costs two transactions, and many files committed together share them. A batch
        that does not go (a subscriber without batches, a failed call) hands each
        aggregate to `publish_aggregate`'s loop under the lease it holds, one by one
        first, which retries, backs off or dead-letters as before (a lone event does that
        itself). Events past the round's cut go in the next round, at once (`run`)."""
        async with self.sessions() as session:
            # Reads take no write lock (SQLite): committing writers do not wait on them.
            await read_only(session)
            aggregates = await pending_aggregates(session, self.batch_size)
        self._cut = len(aggregates) >= self.batch_size
        now = time.monotonic()
        due = {
            key: aggregate
            for aggregate in aggregates
            if self._backoff.get(key := leases.aggregate_key(*aggregate), (0, 0.0))[1] <= now
        }
        if not due:
            return 0
        held, rows = await self._write(
            lambda session: take_round(
                session, due, self.relay_id, self.lease_seconds, self.batch_size
            )
        )
        round_ = [(leases.aggregate_key(t, i), row) for t, i, row in rows]
        self._cut = self._cut or len(round_) >= self.batch_size
        if len(round_) == 1:
            key, row = round_[0]
            if await self._publish_one(key, held[key], row, release=held):
                self._backoff.pop(key, None)
                return 1
            # Not sent (it backs off) or the lease lost: give up what is still ours.
            with contextlib.suppress(Exception):
                await self._write(lambda session: leases.release_many(session, held))
            return 0
        if len(round_) > 1 and await send_batch(self.subscribers, round_):
            return await self._settle_round(held, round_)
        batches = not round_  # nothing read (a race): each aggregate looks again
        slots = asyncio.Semaphore(self.concurrency)

        async def alone(key: str) -> int:
            async with slots:
                return await self._drain(key, *due[key], held[key], batches=batches)

        return sum(await asyncio.gather(*(alone(key) for key in held)))

    async def publish_aggregate(self, aggregate_type: str, aggregate_id: str) -> int:
        """Publish one aggregate's pending events under its lease; returns how many."""
        key = leases.aggregate_key(aggregate_type, aggregate_id)
        token = await self._write(
            lambda session: leases.acquire(session, key, self.relay_id, self.lease_seconds)
        )
        if token is None:
            return 0  # another relay is on it
        return await self._drain(key, aggregate_type, aggregate_id, token)

    async def _drain(
        self,
        key: str,
        aggregate_type: str,
        aggregate_id: str,
        token: str,
        *,
        batches: bool = True,
    ) -> int:
        """Publish the aggregate's events until none is left, then release its lease.
        `batches=False`: the first read goes one by one (its batch just failed)."""
        published = 0
        try:
            while True:
                async with self.sessions() as session:
                    await read_only(session)
                    batch = await unpublished_events(
                        session, aggregate_type, aggregate_id, self.batch_size
                    )
                if not batch:
                    break
                if len(batch) > 1 and batches:
                    outcome = await self._publish_batch(key, token, batch)
                    if outcome is None:
                        return published  # the lease ended: another relay owns it now
                    if outcome:
                        published += len(batch)
                        continue
                batches = True
                for row in batch:
                    if not await self._publish_one(key, token, row):
                        return published
                    published += 1
            self._backoff.pop(key, None)
            return published
        finally:
            with contextlib.suppress(Exception):
                await self._write(lambda session: leases.release(session, key, token))

    async def _settle_round(
        self, held: dict[str, str], batch: list[tuple[str, OutboxEvent]]
    ) -> int:
        """Mark a sent round's events whose lease is still ours and give the leases up, in
        one transaction; returns how many were marked."""
        sent = [(key, row.id) for key, row in batch]
        ours = await self._write(lambda session: settle_round(session, held, sent))
        marked = [(key, row) for key, row in batch if key in ours]
        for key in held.keys() - ours:
            log.warning("relay_lease_lost", aggregate=key)
        for key in ours:
            self._backoff.pop(key, None)
        self._published(marked)
        return len(marked)

    async def _publish_batch(self, key: str, token: str, batch: list[OutboxEvent]) -> bool | None:
        """Publish one aggregate's `batch` with one call per subscriber, mark it in one
        transaction. True: done; False: not sent as a batch, publish it one by one; None:
        lease lost."""
        if not await send_batch(self.subscribers, [(key, row) for row in batch]):
            return False
        if not await self._mark(key, token, [row.id for row in batch], {}):
            log.warning("relay_lease_lost", aggregate=key, event_id=batch[0].event.event_id)
            return None
        self._published([(key, row) for row in batch])
        return True

    async def _mark(
        self, key: str, token: str, row_ids: list[int], release: dict[str, str]
    ) -> bool:
        """Mark `row_ids` under the lease on `key` (`bookkeeping.mark_under_lease`)."""
        return await self._write(
            lambda session: mark_under_lease(
                session, key, token, self.lease_seconds, row_ids, release
            )
        )

    def _published(self, batch: list[tuple[str, OutboxEvent]]) -> None:
        for key, row in batch:
            event = row.event
            metrics.OUTBOX_PUBLISHED.labels(event.event_type).inc()
            # One line per event under its own correlation id, as one by one: an id is
            # followed from the chunk to the notification whichever way it was sent. A key
            # of the line rather than a context bound around it: the same line, cheaper.
            log.info(
                "outbox_event_published",
                event_id=event.event_id,
                aggregate=key,
                version=event.version,
                batch=len(batch),
                correlation_id=usable(event.correlation_id),
            )

    async def _publish_one(
        self, key: str, token: str, row: OutboxEvent, *, release: dict[str, str] | None = None
    ) -> bool:
        """Publish `row` and mark it (or dead-letter it), under the lease. `release`:
        leases (key: token) to give up in the marking transaction, when it commits."""
        row_id, event = row.id, row.event
        with bound_correlation_id(event.correlation_id):
            try:
                # The publish continues the trace of the transaction that recorded it.
                with tracing.continued(
                    row.traceparent,
                    "outbox publish",
                    aggregate=key,
                    event_id=event.event_id,
                    version=event.version,
                    correlation_id=event.correlation_id,
                ):
                    for subscriber in self.subscribers:
                        await subscriber.publish(event)
            except Exception as exc:
                if is_permanent(exc):
                    return await self._dead_letter(key, token, row_id, event, exc, release)
                failures = self._backoff.get(key, (0, 0.0))[0] + 1
                delay = min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2 ** min(failures - 1, 20))
                self._backoff[key] = (failures, time.monotonic() + delay)
                metrics.OUTBOX_PUBLISH_FAILURES.labels(event.event_type).inc()
                log.warning(
                    "outbox_publish_failed",
                    event_id=event.event_id,
                    aggregate=key,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_seconds=delay,
                )
                return False
            if not await self._mark(key, token, [row_id], release or {}):
                log.warning("relay_lease_lost", aggregate=key, event_id=event.event_id)
                return False
            metrics.OUTBOX_PUBLISHED.labels(event.event_type).inc()
            log.info(
                "outbox_event_published",
                event_id=event.event_id,
                aggregate=key,
                version=event.version,
            )
            return True

    async def _dead_letter(
        self,
        key: str,
        token: str,
        row_id: int,
        event: events_pb2.Event,
        exc: BaseException,
        release: dict[str, str] | None = None,
    ) -> bool:
        """Refused for good: move the event to dead_letters and go on with the aggregate."""
        metrics.OUTBOX_PUBLISH_FAILURES.labels(event.event_type).inc()
        if not await self._write(
            lambda session: dead_letter_under_lease(
                session,
                key,
                token,
                self.lease_seconds,
                (row_id, event),
                exc,
                self.relay_id,
                release or {},
            )
        ):
            log.warning("relay_lease_lost", aggregate=key, event_id=event.event_id)
            return False
        metrics.OUTBOX_DEAD_LETTERS.labels(event.event_type).inc()
        log.error(
            "outbox_event_dead_lettered",
            event_id=event.event_id,
            aggregate=key,
            version=event.version,
            error=f"{type(exc).__name__}: {exc}",
        )
        return True
