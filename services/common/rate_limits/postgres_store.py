"""Counts in PostgreSQL, the database every replica of the service already shares.

One statement per reservation (limiter.py), on connections of the store's own in
autocommit: no pool checkout, no ping, no transaction around it. The table is UNLOGGED
(schema.py): a count is worth a window, so it is not written to the WAL, and a commit
that wrote only unlogged rows waits for no WAL flush. A crash empties it, which lets each
caller a fresh window once.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import psycopg
from sqlalchemy.engine import URL

from services.common.jobs.listener import libpq_url

# Add up to `wanted` units to one key's count for one window, never past `limit`, and say
# how many. A new (key, window) row starts at min(wanted, limit); an existing one takes
# its row lock first (racing replicas queue on it), then grows by what is left below the
# limit. In the UPDATE every right-hand side reads the row as it was, so `granted` is
# this statement's own share. A full row matches no WHERE: no row comes back, 0 granted.
TAKE = """
INSERT INTO rate_limit_counters AS c (key, window_index, count, granted, expires_at)
VALUES (%(key)s, %(window)s, LEAST(%(wanted)s, %(limit)s), LEAST(%(wanted)s, %(limit)s),
        %(expires_at)s)
ON CONFLICT (key, window_index) DO UPDATE
   SET granted = LEAST(%(wanted)s, %(limit)s - c.count),
       count = c.count + LEAST(%(wanted)s, %(limit)s - c.count)
 WHERE c.count < %(limit)s
RETURNING granted
"""

# Counts past their expiry (a window after their own): each replica, once per window.
PURGE = "DELETE FROM rate_limit_counters WHERE expires_at < %(now)s"


class PostgresCounterStore:
    """`CounterStore` in the `rate_limit_counters` table (see the module docstring)."""

    def __init__(self, url: URL, connections: int = 2) -> None:
        self._conninfo = libpq_url(url)
        self._slots: list[psycopg.AsyncConnection[tuple[int]] | None] = [None] * connections
        self._connecting = [asyncio.Lock() for _ in range(connections)]
        self._turn = itertools.cycle(range(connections))
        self._purged_window = -1

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        """Add up to `wanted` units to (key, window), never past `limit`; how many."""
        slot = next(self._turn)
        conn = await self._connection(slot)
        try:
            if window > self._purged_window:
                self._purged_window = window
                await conn.execute(PURGE, {"now": int(time.time())})
            cursor = await conn.execute(
                TAKE,
                {
                    "key": key,
                    "window": window,
                    "wanted": wanted,
                    "limit": limit,
                    "expires_at": expires_at,
                },
            )
            row = await cursor.fetchone()
        except psycopg.Error:
            # A lost connection is replaced on the next call; the error fails this one open.
            if conn.broken or conn.closed:
                self._slots[slot] = None
                await conn.close()
            raise
        return int(row[0]) if row is not None else 0

    async def _connection(self, slot: int) -> psycopg.AsyncConnection[tuple[int]]:
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
        for i, conn in enumerate(self._slots):
            self._slots[i] = None
            if conn is not None:
                await conn.close()
