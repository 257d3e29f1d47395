"""Counts in PostgreSQL, the database every replica of the service already shares.

One statement for the reservations (limiter.py) queued at the time, on connections of
the store's own in autocommit: no pool checkout, no ping, no transaction around it. The
table is UNLOGGED (schema.py): a count is worth a window, so it is not written to the
WAL, and a commit that wrote only unlogged rows waits for no WAL flush. A crash empties
it, which lets each caller a fresh window once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy.engine import URL

from services.common.jobs.listener import libpq_url

# Add up to `wanted` units to each key's count for one window, never past its `limit`, and
# say how many: one statement for every request queued at the time (see `take`). A new
# (key, window) row starts at min(wanted, limit); an existing one takes its row lock first
# (racing replicas queue on it; rows are locked in (key, window) order, so two replicas'
# statements cannot deadlock), then grows by what is left below the limit. A new row's
# `granted` holds the limit meanwhile, so the UPDATE reads wanted and limit from EXCLUDED
# (count, granted); every right-hand side reads the row as it was, so `granted` is then
# this statement's own share, and LEAST(granted, count) is the share either way. A full
# row matches no WHERE: no row comes back, 0 granted.
TAKE = """
INSERT INTO rate_limit_counters AS c (key, window_index, count, granted, expires_at)
SELECT r.key, r.window_index, LEAST(r.wanted, r.lim), r.lim, r.expires_at
  FROM unnest(%(keys)s::text[], %(windows)s::bigint[], %(wanted)s::int[], %(limits)s::int[],
              %(expires)s::bigint[]) AS r(key, window_index, wanted, lim, expires_at)
 ORDER BY r.key, r.window_index
ON CONFLICT (key, window_index) DO UPDATE
   SET granted = LEAST(EXCLUDED.count, EXCLUDED.granted - c.count),
       count = c.count + LEAST(EXCLUDED.count, EXCLUDED.granted - c.count)
 WHERE c.count < EXCLUDED.granted
RETURNING key, window_index, LEAST(granted, count)
"""
# Most requests one statement carries.
TAKE_ROWS_MAX = 1_000

# Counts past their expiry (a window after their own): each replica, once per window.
PURGE = "DELETE FROM rate_limit_counters WHERE expires_at < %(now)s"


@dataclass
class _Request:
    key: str
    window: int
    wanted: int
    limit: int
    expires_at: int
    answer: asyncio.Future[int]


class PostgresCounterStore:
    """`CounterStore` in the `rate_limit_counters` table (see the module docstring).

    Requests wait in one queue; each connection, when free, sends everything queued as
    one statement. A burst over many keys (a share told to 10,000 users' streams spends
    one unit of each user's key) costs a few statements, not one round trip a key.
    """

    def __init__(self, url: URL, connections: int = 2) -> None:
        self._conninfo = libpq_url(url)
        self._slots: list[psycopg.AsyncConnection[tuple[Any, ...]] | None] = [None] * connections
        self._connecting = [asyncio.Lock() for _ in range(connections)]
        self._free = list(range(connections))
        self._queue: deque[_Request] = deque()
        self._senders: set[asyncio.Task[None]] = set()
        self._purged_window = -1

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        """Add up to `wanted` units to (key, window), never past `limit`; how many."""
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(key, window, wanted, limit, expires_at, answer))
        if self._free:
            sender = asyncio.create_task(self._send(self._free.pop()))
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)
        return await answer

    async def _send(self, slot: int) -> None:
        """Send what is queued from connection `slot` until the queue is empty."""
        try:
            while self._queue:
                batch = self._next_batch()
                if not batch:
                    continue  # every caller queued meanwhile is gone
                try:
                    granted = await self._take(slot, batch)
                except Exception as exc:  # each caller fails open (limiter.py)
                    for request in batch:
                        if not request.answer.done():
                            request.answer.set_exception(exc)
                    continue
                for request in batch:
                    if not request.answer.done():
                        request.answer.set_result(granted.get((request.key, request.window), 0))
        finally:
            self._free.append(slot)

    def _next_batch(self) -> list[_Request]:
        """Up to TAKE_ROWS_MAX queued requests, one per (key, window) (a statement may
        touch a row once; a repeat waits for the next statement)."""
        batch: dict[tuple[str, int], _Request] = {}
        repeats: list[_Request] = []
        while self._queue and len(batch) < TAKE_ROWS_MAX:
            request = self._queue.popleft()
            if request.answer.done():
                continue  # its caller is gone
            if (request.key, request.window) in batch:
                repeats.append(request)
            else:
                batch[(request.key, request.window)] = request
        self._queue.extendleft(reversed(repeats))
        return list(batch.values())

    async def _take(self, slot: int, batch: list[_Request]) -> dict[tuple[str, int], int]:
        """Run TAKE for `batch` on connection `slot`: (key, window) -> units granted."""
        conn = await self._connection(slot)
        try:
            window = max(r.window for r in batch)
            if window > self._purged_window:
                self._purged_window = window
                await conn.execute(PURGE, {"now": int(time.time())})
            cursor = await conn.execute(
                TAKE,
                {
                    "keys": [r.key for r in batch],
                    "windows": [r.window for r in batch],
                    "wanted": [r.wanted for r in batch],
                    "limits": [r.limit for r in batch],
                    "expires": [r.expires_at for r in batch],
                },
            )
            rows = await cursor.fetchall()
        except psycopg.Error:
            # A lost connection is replaced on the next call; the error fails this one open.
            if conn.broken or conn.closed:
                self._slots[slot] = None
                await conn.close()
            raise
        return {(key, window): int(granted) for key, window, granted in rows}

    async def _connection(self, slot: int) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        conn = self._slots[slot]
        if conn is not None and not conn.closed:
            return conn
        # One connect per slot at a time: a burst of calls waits for it, never opens one each.
        async with self._connecting[slot]:
            conn = self._slots[slot]
            if conn is None or conn.closed:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                self._slots[slot] = conn
            return conn

    async def close(self) -> None:
        """Close the store's connections."""
        for sender in list(self._senders):
            sender.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        for i, conn in enumerate(self._slots):
            self._slots[i] = None
            if conn is not None:
                await conn.close()
