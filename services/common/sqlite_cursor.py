"""A cursor for SQLAlchemy's aiosqlite adapter that costs one thread hand-off a statement.

aiosqlite runs every step of a cursor (make it, execute, fetch the rows, close it) as its
own call on the connection's thread, and SQLAlchemy's adapter takes all four for every
statement: four wake-ups of that thread and four returns of the GIL to the event loop.
On the small-file path that hand-off was ~30% of the upload service's event loop. This
cursor does the four in one call and keeps what SQLAlchemy reads afterwards (the rows,
`description`, `rowcount`, `lastrowid`); the sqlite3 cursor is closed before the call
returns, so a statement cancelled before its rows were read leaves no active statement
holding SQLite's write lock.

Inside a write transaction (the connection holds its process's writer turn,
`sqlite_writers`) a statement runs right where it is called, on the event loop's thread:
such statements are short (they hold the one write lock, so every writer waits on them
anyway), and the hand-off cost more than they do (a bare hop ~140 us on this machine's
2 cores; a primary-key insert ~5 us). BEGIN IMMEDIATE, the COMMIT (its fsync), every
statement of a read-only transaction and a big write (more than 64 parameters, or more
than 8 rows to executemany: a large fan-out's multi-row inserts) still go to the thread,
so a long statement never holds up the loop.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from services.common.sqlite_writers import BEGIN_WRITE

_Outcome = tuple[list[Any], Any, int, int | None]


class _OnThread(Protocol):
    """aiosqlite's connection: runs a function on its thread (`_execute`)."""

    @property
    def _conn(self) -> sqlite3.Connection: ...

    async def _execute(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...

    async def begin_write(self) -> None: ...

    @property
    def writes_inline(self) -> bool: ...


# A write statement bigger than this (a multi-row insert of a large fan-out) still goes to
# the connection's thread: it could hold the event loop for tens of milliseconds.
_INLINE_PARAMETERS = 64
_INLINE_ROWS = 8


def _small(parameters: Any) -> bool:
    return parameters is None or len(parameters) <= _INLINE_PARAMETERS


def _run(connection: _OnThread, sql: str, parameters: Any, many: bool) -> _Outcome:
    """On the connection's thread: execute, fetch and close in one go."""
    cursor = connection._conn.cursor()
    try:
        if many:
            cursor.executemany(sql, parameters)
        else:
            cursor.execute(sql, () if parameters is None else parameters)
        rows = cursor.fetchall() if cursor.description else []
        return rows, cursor.description, cursor.rowcount, cursor.lastrowid
    finally:
        cursor.close()


class OneHopCursor:
    """What SQLAlchemy's adapter uses of an aiosqlite cursor (module docstring)."""

    arraysize = 1

    def __init__(self, connection: _OnThread) -> None:
        self._connection = connection
        self._rows: list[Any] = []
        self._at = 0
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None

    async def __aenter__(self) -> OneHopCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def execute(self, sql: str, parameters: Any = None) -> OneHopCursor:
        """Run `sql`; its rows, if any, are read with it."""
        if sql == BEGIN_WRITE:  # in the process's writer turn (`sqlite_writers`)
            await self._connection.begin_write()
            self._keep(([], None, -1, None))
            return self
        await self._dispatch(sql, parameters, False, _small(parameters))
        return self

    async def executemany(self, sql: str, parameters: Iterable[Any]) -> OneHopCursor:
        """Run `sql` once per parameter set."""
        parameters = list(parameters)
        await self._dispatch(sql, parameters, True, len(parameters) <= _INLINE_ROWS)
        return self

    async def _dispatch(self, sql: str, parameters: Any, many: bool, small: bool) -> None:
        """Where the write turn is held and the statement small, here; else on the thread."""
        if small and self._connection.writes_inline:
            self._keep(_run(self._connection, sql, parameters, many))
        else:
            self._keep(
                await self._connection._execute(_run, self._connection, sql, parameters, many)
            )

    def _keep(self, outcome: _Outcome) -> None:
        self._rows, self.description, self.rowcount, self.lastrowid = outcome
        self._at = 0

    async def fetchone(self) -> Any:
        """The next row, or None."""
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    async def fetchmany(self, size: int | None = None) -> Sequence[Any]:
        """The next `size` rows (`arraysize` by default)."""
        end = self._at + (self.arraysize if size is None else size)
        rows, self._at = self._rows[self._at : end], min(end, len(self._rows))
        return rows

    async def fetchall(self) -> Sequence[Any]:
        """The rows not read yet."""
        rows, self._at = self._rows[self._at :], len(self._rows)
        return rows

    async def close(self) -> None:
        """Drop the rows (the sqlite3 cursor is closed already)."""
        self._rows, self._at = [], 0
