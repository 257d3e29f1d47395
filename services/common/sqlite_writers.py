"""One SQLite writer at a time in this process, handed on without SQLite's busy sleeps.

Every SQLite transaction that may write begins IMMEDIATE (`db.py`), which takes the
database's write lock. A connection that finds the lock held waits in SQLite's busy
handler, which polls by sleeping 1, 2, 5, 10, ... ms: it is never woken when the lock is
freed. With the group commit, the outbox relay and the job runtime writing on their own
connections, a small file's BEGIN IMMEDIATE waited 6.8 ms on average, alone on the
machine, most of it asleep after the lock was free.

So the connections of one process to one database file take turns in front of SQLite: a
connection takes the file's turn before its BEGIN IMMEDIATE and gives it back when its
transaction ends (COMMIT, ROLLBACK, close, terminate); the next in line is woken at once,
first come first served. SQLite's own lock still guards the file against other processes
(a second replica, `serentak-admin`), whose writers keep the busy handler. A turn not had
within the busy timeout fails as SQLite would ("database is locked"), so a transaction
waiting on one held by its own task fails instead of hanging. While a connection holds
the turn its statements run on the event loop's thread (`sqlite_cursor`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import weakref

BEGIN_WRITE = "BEGIN IMMEDIATE"

# Per event loop (tests run several), per database file.
_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


class WriterTurn:
    """A connection's claim on its database file's writer turn (module docstring)."""

    __slots__ = ("_held", "_loop", "_path")

    def __init__(self, path: str) -> None:
        # An in-memory database is private to its connection: no turn to take.
        self._path = None if path in ("", ":memory:") or path.startswith("file::memory:") else path
        self._held: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def held(self) -> bool:
        """True between `take` and `give_back`."""
        return self._held is not None

    async def take(self, timeout_seconds: float) -> None:
        """Wait for the turn (before BEGIN IMMEDIATE); `sqlite3.OperationalError` if it is
        not had within `timeout_seconds`."""
        if self._path is None or self._held is not None:
            return
        loop = asyncio.get_running_loop()
        turn = _TURNS.setdefault(loop, {}).setdefault(self._path, asyncio.Lock())
        try:
            async with asyncio.timeout(timeout_seconds):
                await turn.acquire()
        except TimeoutError:
            raise sqlite3.OperationalError("database is locked") from None
        self._held, self._loop = turn, loop

    def give_back(self) -> None:
        """End the turn, if held (the transaction is over or the connection is gone).
        Safe from any thread: off the loop's thread the release is posted to it."""
        turn, loop = self._held, self._loop
        if turn is None or loop is None:
            return
        self._held = self._loop = None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            turn.release()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(turn.release)
