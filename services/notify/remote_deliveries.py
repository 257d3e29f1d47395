"""Other replicas' commits as deliveries: one read per burst of wake-ups, not one per stream.

A NOTIFY names the users whose stream positions a commit moved (`stream_listener`); for
a commit of another replica, each of this replica's streams of those users used to read
the database after its own cursor. A file shared with 100 users whose streams sit here
then cost 100 reads per commit, and at 50 commits/s the replica that did not write them
fell far behind (`bench_notify.py --streams-on-replica`, audience 100: commit -> delivery
p50 291-342 ms, against ~15 ms with the streams on the writing replica). Here the
positions woken while a read runs are collected, one statement reads every woken user's
new rows (seq in (published, woken]), and each row becomes a `Delivery` on its user's
streams, as if this replica had committed it.

Nothing here decides what a stream sends: its own rules (seq == last + 1 is sent, a jump
reads the database, seq <= last is skipped; `streams.py`) keep it free of gaps and
duplicates whatever arrives. A user whose rows do not come this way gets the plain
wake-up (its streams read after their cursors): a read that failed, a jump wider than
MAX_GAP, a stream whose buffer has no room. A remote commit never overflows a buffer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from serentak.notify.v1 import notify_pb2
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.logging import get_logger
from services.notify import metrics
from services.notify.messages import to_message
from services.notify.sql import retrying
from services.notify.streams import Broker, UserKey

log = get_logger(__name__)

# Users per read: one statement's arrays stay small, and a burst is drained in order.
MAX_USERS = 500
# Positions one user may have moved since what this replica handed its streams; wider
# (a replica that has not heard for a while) is left to the streams' own paged reads.
MAX_GAP = 64

_READ = text(
    """
SELECT n.notification_id, n.tenant_id, n.user_id, n.seq, n.file_id, n.version,
       n.event_type, n.event_id, n.actor_user_id, n.file_name, n.summary, n.dedupe_key,
       n.digest_count, n.created_at, n.updated_at, n.read_at, n.correlation_id
FROM unnest(CAST(:tenants AS varchar[]), CAST(:users AS varchar[]),
            CAST(:afters AS bigint[]), CAST(:uptos AS bigint[]))
     AS w(tenant_id, user_id, after_seq, upto_seq)
JOIN notifications AS n
  ON n.tenant_id = w.tenant_id AND n.user_id = w.user_id
 AND n.seq > w.after_seq AND n.seq <= w.upto_seq
ORDER BY n.tenant_id, n.user_id, n.seq
"""
)


class RemoteDeliveries:
    """Turns wake-ups for positions committed elsewhere into deliveries, a read per burst.

    `request` never waits; `run` (a background task of the service) does the reads."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: Broker) -> None:
        self._sessions = sessions
        self._broker = broker
        # User -> (highest position woken, when its first pending wake-up came).
        self._pending: dict[UserKey, tuple[int, float]] = {}
        self._ready = asyncio.Event()
        # Set while `run` runs: only then are requests taken (nobody would read them).
        self.running = asyncio.Event()

    def request(self, key: UserKey, seq: int) -> None:
        """The user's stream reached `seq`, committed elsewhere: deliver it soon (with no
        reader running, its streams are woken to read by themselves)."""
        if not self.running.is_set():
            self._broker.wake_streams(key, seq)
            return
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = (seq, time.perf_counter())
        elif seq > pending[0]:
            self._pending[key] = (seq, pending[1])
        self._ready.set()

    async def run(self) -> None:
        """Read and deliver what was requested, a burst at a time, until cancelled."""
        self.running.set()
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                while self._pending:
                    await self._deliver(self._take())
        finally:
            # Whatever was still pending reads by itself (a stopping service; tests).
            self.running.clear()
            self._wake(self._take(len(self._pending)))

    def _take(self, n: int = MAX_USERS) -> dict[UserKey, tuple[int, float]]:
        keys = list(self._pending)[:n]
        return {key: self._pending.pop(key) for key in keys}

    async def _deliver(self, batch: dict[UserKey, tuple[int, float]]) -> None:
        wanted: list[tuple[UserKey, int, int]] = []
        fallback: dict[UserKey, tuple[int, float]] = {}
        for key, (upto, woken_at) in batch.items():
            published = self._broker.published(key)
            if published is None:
                # Nothing handed out here yet for this user: read only the newest row;
                # a stream behind it sees the jump and reads the rest itself.
                published = upto - 1
            if upto <= published:
                continue
            if upto - published > MAX_GAP:
                fallback[key] = (upto, woken_at)
            else:
                wanted.append((key, published, upto))
        self._wake(fallback)
        if not wanted:
            return
        try:
            rows = await retrying(lambda: self._read(wanted))
            metrics.REMOTE_READS.inc()
            self._hand_out(wanted, rows, batch)
        except BaseException as exc:
            # A failed read (or a stop in the middle of one) loses nothing: the streams
            # read after their cursors by themselves; a delivery handed out twice is
            # skipped by its stream (seq <= last).
            self._wake({key: batch[key] for key, _, _ in wanted})
            if not isinstance(exc, Exception):
                raise
            log.warning("remote_read_failed", users=len(wanted), error=repr(exc))

    def _hand_out(
        self,
        wanted: Sequence[tuple[UserKey, int, int]],
        rows: Sequence[Any],
        batch: dict[UserKey, tuple[int, float]],
    ) -> None:
        by_user: dict[UserKey, list[Any]] = {}
        for row in rows:
            by_user.setdefault((row.tenant_id, row.user_id), []).append(row)
        for key, _, upto in wanted:
            responses = [(row.seq, _response(to_message(row))) for row in by_user.get(key, ())]
            # The delivery latency of a remote row counts from its wake-up's arrival here.
            self._broker.deliver_remote(key, responses, upto, batch[key][1])

    async def _read(self, wanted: Sequence[tuple[UserKey, int, int]]) -> list[Any]:
        async with self._sessions() as session:
            result = await session.execute(
                _READ,
                {
                    "tenants": [key[0] for key, _, _ in wanted],
                    "users": [key[1] for key, _, _ in wanted],
                    "afters": [after for _, after, _ in wanted],
                    "uptos": [upto for _, _, upto in wanted],
                },
            )
            return list(result)

    def _wake(self, batch: dict[UserKey, tuple[int, float]]) -> None:
        for key, (upto, _) in batch.items():
            self._broker.wake_streams(key, upto)


def _response(message: notify_pb2.Notification) -> notify_pb2.SubscribeResponse:
    return notify_pb2.SubscribeResponse(notification=message, cursor=message.cursor)
