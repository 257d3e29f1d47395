"""Subscribe: per-user live delivery with a resumable cursor and bounded buffers.

Broker. In-process: a fan-out publishes what it committed to the open streams of each
user. Every stream owns a bounded queue; publishing never waits, so a slow subscriber
cannot hold up the fan-out or other subscribers. When a stream's queue is full the
stream is dropped with RESOURCE_EXHAUSTED (reason SUBSCRIBER_TOO_SLOW, carrying its last
cursor) and the client resumes from that cursor.

No gap, no duplicate. A stream registers its queue *before* reading the backlog from the
database, so anything committed after the read is also in the queue; it then sends only
seq values above the last one sent. Seq values of one user are assigned in commit order
(`models.UserStream`), so a live item with seq == last + 1 is sent straight away; a
larger jump (a digest moved a row forward, or another commit's publish has not run yet)
triggers a read of `seq > last` from the database, which by then holds everything up to
the live item.

A digest update arrives as the same `notification_id` with a new cursor: clients replace
the notification they already show.

Replicas. Streams are served by the process holding them, and the broker only hears
fan-outs of its own process. With one notify replica (the embedded default) that is all
of them. Several replicas would each need to learn of the others' commits — PostgreSQL
LISTEN/NOTIFY on the user key, or a short poll of `read_after` — before being deployed.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from serentak.notify.v1 import notify_pb2
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.logging import get_logger
from services.notify import cursors, metrics, reading
from services.notify.errors import SubscriberTooSlow
from services.notify.fanout import Written
from services.notify.messages import to_message

log = get_logger(__name__)
REPLAY_PAGE = 200
UserKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One notification on its way to a stream; `committed_at` is a perf_counter() value."""

    seq: int
    message: notify_pb2.Notification
    committed_at: float


@dataclass(eq=False)
class Subscription:
    """One open stream's queue."""

    key: UserKey
    device_id: str
    queue: asyncio.Queue[Delivery]
    overflowed: bool = False
    opened_at: float = field(default_factory=time.perf_counter)

    def offer(self, delivery: Delivery) -> bool:
        """Queue `delivery` without waiting; False (and overflowed) when the buffer is full."""
        try:
            self.queue.put_nowait(delivery)
        except asyncio.QueueFull:
            self.overflowed = True
            return False
        return True


class Broker:
    """Open streams per (tenant, user); hands committed notifications to them."""

    def __init__(self, buffer_size: int) -> None:
        self._buffer_size = buffer_size
        self._streams: defaultdict[UserKey, set[Subscription]] = defaultdict(set)

    def open(self, tenant_id: str, user_id: str, device_id: str) -> Subscription:
        """Register a stream; it receives everything published from now on."""
        sub = Subscription((tenant_id, user_id), device_id, asyncio.Queue(self._buffer_size))
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

    def open_count(self) -> int:
        """How many streams are open."""
        return sum(len(s) for s in self._streams.values())

    def publish(self, written: Iterable[Written]) -> None:
        """Hand committed notifications to their users' streams; never waits."""
        now = time.perf_counter()
        for w in written:
            for sub in list(self._streams.get((w.tenant_id, w.user_id), ())):
                if not sub.offer(Delivery(w.seq, w.message, now)):
                    # Drop it now: it stops collecting, and its handler ends on next wake.
                    self.close(sub)
                    metrics.STREAMS_DROPPED.inc()
                    log.info("stream_dropped", user_id=w.user_id, device_id=sub.device_id)


class StreamReader:
    """Serves one Subscribe call: replay after the cursor, then live, in seq order."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: Broker) -> None:
        self._sessions = sessions
        self._broker = broker

    async def _replay(
        self, tenant_id: str, user_id: str, after: int
    ) -> AsyncIterator[notify_pb2.Notification]:
        while True:
            async with self._sessions() as session:
                rows = await reading.read_after(session, tenant_id, user_id, after, REPLAY_PAGE)
            for row in rows:
                yield to_message(row)
            if len(rows) < REPLAY_PAGE:
                return
            after = rows[-1].seq

    async def _position(self, tenant_id: str, user_id: str) -> int:
        async with self._sessions() as session:
            return await reading.stream_position(session, tenant_id, user_id)

    async def subscribe(
        self, tenant_id: str, user_id: str, after_seq: int | None, device_id: str
    ) -> AsyncIterator[notify_pb2.SubscribeResponse]:
        """Notifications after `after_seq` (None: only new ones), then live ones."""
        sub = self._broker.open(tenant_id, user_id, device_id)
        try:
            # Registered first: whatever commits after the reads below is also queued.
            if after_seq is None:
                last = await self._position(tenant_id, user_id)
                # A position marker (no notification): the client has a cursor to resume
                # from even if it leaves before its first notification arrives.
                yield notify_pb2.SubscribeResponse(cursor=cursors.encode(last))
            else:
                last = after_seq
            async for message in self._replay(tenant_id, user_id, last):
                last = int(message.cursor)
                yield notify_pb2.SubscribeResponse(notification=message, cursor=message.cursor)
            while True:
                if sub.overflowed:
                    raise SubscriberTooSlow(sub.queue.qsize(), cursors.encode(last))
                delivery = await sub.queue.get()
                if sub.overflowed:
                    raise SubscriberTooSlow(sub.queue.qsize(), cursors.encode(last))
                if delivery.seq <= last:
                    continue
                if delivery.seq == last + 1:
                    last = delivery.seq
                    metrics.DELIVERY_LATENCY.observe(time.perf_counter() - delivery.committed_at)
                    yield notify_pb2.SubscribeResponse(
                        notification=delivery.message, cursor=delivery.message.cursor
                    )
                    continue
                async for message in self._replay(tenant_id, user_id, last):
                    last = int(message.cursor)
                    yield notify_pb2.SubscribeResponse(notification=message, cursor=message.cursor)
        finally:
            self._broker.close(sub)
