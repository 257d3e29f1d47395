"""Subscribe: per-user live delivery with a resumable cursor and bounded buffers.

Broker. A fan-out publishes what it committed to the open streams of each user in its
own process (the fast path: the message itself). Every stream owns a bounded queue;
publishing never waits, so a slow subscriber cannot hold up the fan-out or other
subscribers. When a stream's queue is full the stream is dropped with RESOURCE_EXHAUSTED
(reason SUBSCRIBER_TOO_SLOW, carrying its last cursor) and the client resumes from that
cursor.

No gap, no duplicate. A stream registers its queue *before* reading the backlog from the
database, so anything committed after the read is also in the queue; it then sends only
seq values above the last one sent. Seq values of one user are assigned in commit order
(`models.UserStream`), so a live item with seq == last + 1 is sent straight away; a
larger jump (a digest moved a row forward, another commit's publish has not run yet, or
a wake-up) triggers a read of `seq > last` from the database, which by then holds
everything up to the live item.

A digest update arrives as the same `notification_id` with a new cursor: clients replace
the notification they already show.

Replicas. On PostgreSQL every new stream position is NOTIFYed at commit (migration
notify_0005) and each replica's `stream_listener` turns it into a wake-up (`Broker.wake`)
of that user's streams: no message, only "read after your cursor". Another replica's
commits are read once per burst of wake-ups for every woken user and queued as
deliveries (`remote_deliveries.py`); what cannot come that way stays a wake-up. Wake-ups
coalesce outside the buffer (a pending seq per stream), so remote commits never overflow
it; a stream that reads slowly just reads more per wake-up. When the listener
(re)connects it wakes every stream, covering whatever was committed while nobody
listened. A replica's own commits
reach its streams twice (publish, then the NOTIFY): its NOTIFY is held while it commits
(`Broker.committing`), and a wake-up for a seq this replica has published is dropped (its
streams hold the delivery), so an own commit costs neither a wake-up nor a read. On SQLite
there is no cross-process signal: one notify replica.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from serentak.notify.v1 import notify_pb2
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.db import read_only
from services.common.logging import get_logger
from services.notify import cursors, metrics, reading
from services.notify.errors import SubscriberTooSlow
from services.notify.fanout import Written
from services.notify.messages import to_message
from services.notify.positions import PositionReads
from services.notify.sql import retrying

log = get_logger(__name__)
REPLAY_PAGE = 200
UserKey = tuple[str, str]
# Wake-up seq that makes a stream read the database whatever its cursor.
ANY_SEQ = 2**62


class RemoteReader(Protocol):
    """Reads other replicas' commits for the broker (`remote_deliveries.RemoteDeliveries`)."""

    def request(self, key: UserKey, seq: int) -> None:
        """Another replica committed `key`'s notifications up to `seq`: deliver them."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One notification on its way to a stream; `committed_at` is a perf_counter() value."""

    seq: int
    # The stream item itself: built once per user, shared (never changed) by its streams.
    response: notify_pb2.SubscribeResponse
    committed_at: float


@dataclass(eq=False, slots=True)
class Subscription:
    """One open stream's buffer of deliveries, and its pending wake-up.

    Small while idle (thousands are open at once, issue 37): no buffer until a delivery
    arrives (and none again once it is drained), and a future to wait on only while the
    stream waits. An `asyncio.Queue` and `asyncio.Event` would hold five deques (~3.8 KiB)
    per idle stream."""

    key: UserKey
    device_id: str
    # The most deliveries buffered at once; one more overflows the stream.
    capacity: int
    overflowed: bool = False
    # The highest seq announced by wake-ups not yet taken (0: none pending). Outside the
    # buffer: wake-ups coalesce and never count against it.
    wake_seq: int = 0
    # Deliveries not yet taken, oldest first; None while there are none.
    _buffer: deque[Delivery] | None = None
    # Resolved when there is something to look at (a delivery, a wake-up, an overflow);
    # None unless `next` is waiting.
    _waiter: asyncio.Future[None] | None = None

    def _changed(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def queued(self) -> int:
        """How many deliveries are buffered."""
        return len(self._buffer) if self._buffer is not None else 0

    def offer(self, delivery: Delivery) -> bool:
        """Queue `delivery` without waiting; False (and overflowed) when the buffer is full."""
        self._changed()
        if self.queued() >= self.capacity:
            self.overflowed = True
            return False
        self._append(delivery)
        return True

    def offer_if_room(self, delivery: Delivery) -> bool:
        """Queue `delivery` if the buffer has room (False, nothing changed, if not)."""
        if self.queued() >= self.capacity:
            return False
        self._append(delivery)
        self._changed()
        return True

    def _append(self, delivery: Delivery) -> None:
        if self._buffer is None:
            self._buffer = deque()
        self._buffer.append(delivery)

    def pop(self) -> Delivery | None:
        """The oldest buffered delivery, taken; None when none is buffered."""
        buffer = self._buffer
        if not buffer:
            return None
        delivery = buffer.popleft()
        if not buffer:
            self._buffer = None  # an idle stream holds no buffer
        return delivery

    def wake(self, seq: int) -> None:
        """Announce that the user's stream reached `seq`; never waits, never overflows."""
        self.wake_seq = max(self.wake_seq, seq)
        self._changed()

    def take_wake(self) -> int:
        """The seq announced by the wake-ups so far, clearing them."""
        seq, self.wake_seq = self.wake_seq, 0
        return seq

    async def next(self) -> Delivery | int:
        """The next queued delivery; when none is queued, the pending wake-up's seq.

        Deliveries come first: they are this replica's own commits, whose NOTIFY may
        arrive just before their publish, and by the time the queue is empty they have
        moved the cursor past the wake-up (no database read needed)."""
        while True:
            delivery = self.pop()
            if delivery is not None:
                return delivery
            if self.wake_seq:
                return self.take_wake()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class Broker:
    """Open streams per (tenant, user); hands committed notifications to them."""

    def __init__(self, buffer_size: int) -> None:
        self._buffer_size = buffer_size
        self._streams: defaultdict[UserKey, set[Subscription]] = defaultdict(set)
        # Seqs this process is committing right now, per user, and the wake-ups held back
        # for them (see `committing`).
        self._committing: defaultdict[UserKey, set[int]] = defaultdict(set)
        self._held: dict[UserKey, int] = {}
        # The highest seq published here per user with open streams: a wake-up up to it
        # is this replica's own NOTIFY, already a queued delivery on every stream.
        self._published: dict[UserKey, int] = {}
        # PostgreSQL replicas: other replicas' commits read once per burst, then
        # delivered (`remote_deliveries.py`); None: each woken stream reads by itself.
        self._remote: RemoteReader | None = None

    def attach_remote(self, remote: RemoteReader) -> None:
        """Deliver wake-ups for other replicas' commits through `remote`."""
        self._remote = remote

    def open(self, tenant_id: str, user_id: str, device_id: str) -> Subscription:
        """Register a stream; it receives everything published from now on."""
        sub = Subscription((tenant_id, user_id), device_id, self._buffer_size)
        self._streams[sub.key].add(sub)
        metrics.OPEN_STREAMS.inc()
        return sub

    def close(self, sub: Subscription) -> None:
        """Unregister a stream (idempotent)."""
        streams = self._streams.get(sub.key)
        if streams is not None and sub in streams:
            streams.discard(sub)
            metrics.OPEN_STREAMS.dec()
            if not streams:
                del self._streams[sub.key]
                self._published.pop(sub.key, None)

    def live_users(self) -> Collection[UserKey]:
        """The users with a stream open here now (a live view: copy it to keep it)."""
        return self._streams.keys()

    def open_count(self) -> int:
        """How many streams are open."""
        return sum(len(s) for s in self._streams.values())

    def publish(self, written: Iterable[Written]) -> None:
        """Hand committed notifications to their users' streams; never waits."""
        now = time.perf_counter()
        for w in written:
            key = (w.tenant_id, w.user_id)
            streams = self._streams.get(key)
            if not streams:
                continue
            if w.seq > self._published.get(key, 0):
                self._published[key] = w.seq
            delivery = Delivery(w.seq, w.response(), now)  # one per user, shared by its streams
            for sub in list(streams):
                if not sub.offer(delivery):
                    self._drop(sub)

    def committing(self, written: Iterable[Written]) -> Callable[[bool], None]:
        """Announce a fan-out's transaction about to commit `written`; call the result
        once it has ended (True: committed, then it publishes them).

        The transaction's own NOTIFY can arrive before its publish; a wake-up for a seq
        still being committed here is held until the transaction ends, so own commits
        reach streams as deliveries, never as database reads. A rollback releases the
        held wake-ups (the seq may since have been committed by another replica)."""
        batch = [((w.tenant_id, w.user_id), w.seq) for w in written]
        for key, seq in batch:
            self._committing[key].add(seq)

        def ended(committed: bool) -> None:
            if committed:
                self.publish(written)
            for key, seq in batch:
                seqs = self._committing.get(key)
                if seqs is not None:
                    seqs.discard(seq)
                    if not seqs:
                        del self._committing[key]
                if key not in self._committing and key in self._held:
                    self._wake(key, self._held.pop(key))

        return ended

    def wake(self, tenant_id: str, user_id: str, seq: int) -> None:
        """Tell the user's streams that their stream reached `seq` (committed, maybe by
        another replica); each reads the database after its cursor. Never waits."""
        key = (tenant_id, user_id)
        if seq in self._committing.get(key, ()):
            self._held[key] = max(self._held.get(key, 0), seq)
            return
        self._wake(key, seq)

    def wake_many(self, positions: Iterable[tuple[str, str, int]]) -> None:
        """`wake` for each (tenant_id, user_id, seq) of `positions` (a NOTIFY's)."""
        streams, committing = self._streams, self._committing
        for tenant_id, user_id, seq in positions:
            key = (tenant_id, user_id)
            # A user with no stream here and no commit in flight has nothing to wake or
            # hold (`wake` would do nothing): most of a large audience, skipped cheaply.
            if key in streams or key in committing:
                self.wake(tenant_id, user_id, seq)

    def _wake(self, key: UserKey, seq: int) -> None:
        if seq <= self._published.get(key, 0):
            # Published here (a delivery is queued on each stream open then; a stream
            # opened since read its position from the database): no wake-up, no read.
            return
        if self._remote is not None and seq != ANY_SEQ and key in self._streams:
            self._remote.request(key, seq)
            return
        self.wake_streams(key, seq)

    def wake_streams(self, key: UserKey, seq: int) -> None:
        """Make the user's streams read the database after their cursors, up to `seq`."""
        for sub in self._streams.get(key, ()):
            sub.wake(seq)

    def published(self, key: UserKey) -> int | None:
        """The position up to which every stream of the user open here holds a delivery
        or will read by itself (None: nothing handed out since they opened)."""
        return self._published.get(key)

    def deliver_remote(
        self,
        key: UserKey,
        responses: list[tuple[int, notify_pb2.SubscribeResponse]],
        upto: int,
        woken_at: float,
    ) -> None:
        """Queue rows another replica committed (seq order, up to `upto`) on the user's
        streams; a stream without room for all of them, or a read that stopped short of
        `upto`, gets a wake-up instead: never an overflow from a remote commit."""
        streams = self._streams.get(key)
        if not streams:
            return
        deliveries = [Delivery(seq, response, woken_at) for seq, response in responses]
        short = not deliveries or deliveries[-1].seq < upto
        for sub in list(streams):
            for delivery in deliveries:
                if not sub.offer_if_room(delivery):
                    sub.wake(upto)
                    break
            else:
                if short:
                    sub.wake(upto)
        if upto > self._published.get(key, 0):
            self._published[key] = upto

    def wake_all(self) -> None:
        """Make every open stream read the database after its cursor (notifications may
        have been committed while no wake-up could arrive)."""
        for key in list(self._streams):
            self._wake(key, ANY_SEQ)

    def _drop(self, sub: Subscription) -> None:
        # Drop it now: it stops collecting, and its handler ends on next wake.
        self.close(sub)
        metrics.STREAMS_DROPPED.inc()
        log.info("stream_dropped", user_id=sub.key[1], device_id=sub.device_id)


class StreamReader:
    """Serves one Subscribe call: replay after the cursor, then live, in seq order."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: Broker) -> None:
        self._sessions = sessions
        # Where a stream without a cursor starts, read in batches (positions.py).
        self._positions = PositionReads(sessions)
        self._broker = broker

    async def _replay(
        self, tenant_id: str, user_id: str, after: int, max_batch: int
    ) -> AsyncIterator[notify_pb2.SubscribeResponse]:
        """What the database holds after `after`, page by page, as stream items."""
        while True:
            rows = await retrying(partial(self._read_after, tenant_id, user_id, after))
            messages = [to_message(row) for row in rows]
            if max_batch > 1:
                for start in range(0, len(messages), max_batch):
                    yield batch_response(messages[start : start + max_batch])
            else:
                for message in messages:
                    yield notify_pb2.SubscribeResponse(notification=message, cursor=message.cursor)
            if len(rows) < REPLAY_PAGE:
                return
            after = rows[-1].seq

    async def _read_after(self, tenant_id: str, user_id: str, after: int) -> list[Any]:
        # Pure reads in a snapshot: on SQLite a stream's reads never take the write lock
        # (thousands of streams opening at once would queue on it, and the fan-out too).
        async with self._sessions() as session:
            await read_only(session)
            return list(await reading.read_after(session, tenant_id, user_id, after, REPLAY_PAGE))

    async def subscribe(
        self,
        tenant_id: str,
        user_id: str,
        after_seq: int | None,
        device_id: str,
        max_batch: int = 1,
    ) -> AsyncIterator[notify_pb2.SubscribeResponse]:
        """Notifications after `after_seq` (None: only new ones), then live ones; with
        `max_batch` above 1, up to that many per item, from what is already waiting."""
        sub = self._broker.open(tenant_id, user_id, device_id)
        try:
            # Registered first: whatever commits after the reads below is also queued.
            if after_seq is None:
                last = await self._positions.read(tenant_id, user_id)
                # A position marker (no notification): the client has a cursor to resume
                # from even if it leaves before its first notification arrives. Nothing to
                # replay: whatever commits after that read is queued already.
                yield notify_pb2.SubscribeResponse(cursor=cursors.encode(last))
            else:
                last = after_seq
                async for response in self._replay(tenant_id, user_id, last, max_batch):
                    last = int(response.cursor)
                    yield response
            # A queued delivery taken while filling a batch that cannot join it (a jump in
            # seq): it is the next item to look at.
            carried: Delivery | None = None
            while True:
                if sub.overflowed:
                    raise SubscriberTooSlow(sub.queued(), cursors.encode(last))
                item = carried if carried is not None else await sub.next()
                carried = None
                if sub.overflowed:
                    raise SubscriberTooSlow(sub.queued(), cursors.encode(last))
                delivery = item if isinstance(item, Delivery) else None
                seq = item.seq if isinstance(item, Delivery) else item
                if seq <= last:
                    continue
                if delivery is not None and seq == last + 1:
                    last = seq
                    metrics.DELIVERY_LATENCY.observe(time.perf_counter() - delivery.committed_at)
                    if max_batch <= 1:
                        yield delivery.response
                        continue
                    batch, carried = take_queued(sub, delivery, max_batch)
                    last = int(batch[-1].cursor)
                    yield batch_response(batch)
                    continue
                async for response in self._replay(tenant_id, user_id, last, max_batch):
                    last = int(response.cursor)
                    yield response
        finally:
            self._broker.close(sub)


def take_queued(
    sub: Subscription, first: Delivery, max_batch: int
) -> tuple[list[notify_pb2.Notification], Delivery | None]:
    """`first` and the deliveries queued right behind it in seq order, at most `max_batch`
    in all; and the queued one taken that cannot follow (a jump in seq), if any.

    Only what is queued already: waiting for more would add latency."""
    batch = [first.response.notification]
    last = first.seq
    while len(batch) < max_batch:
        queued = sub.pop()
        if queued is None:
            break
        if queued.seq <= last:
            continue
        if queued.seq != last + 1:
            return batch, queued
        last = queued.seq
        metrics.DELIVERY_LATENCY.observe(time.perf_counter() - queued.committed_at)
        batch.append(queued.response.notification)
    return batch, None


def batch_response(
    notifications: list[notify_pb2.Notification],
) -> notify_pb2.SubscribeResponse:
    """One stream item carrying `notifications` (in cursor order) for a batching stream."""
    return notify_pb2.SubscribeResponse(
        notifications=notifications, cursor=notifications[-1].cursor
    )
