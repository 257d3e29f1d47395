"""Core statements run in a session's transaction straight on its driver connection, on
SQLite and PostgreSQL alike.

`session.execute` costs ~0.3-0.6 ms of event-loop CPU a statement on this kind of machine
(the ORM session, the compile-cache key, the Core connection, the async adapter's greenlet
switch, result wrapping) where the statement itself takes 5-50 us on SQLite and one round
trip on PostgreSQL; a small file's commit runs about fifteen. A `SessionStatement` does
SQLAlchemy's part once: the statement is compiled for the session's dialect (once per
dialect and set of given values, `driver_sql.compile_statement`), and values pass through
the columns' own bind and result processors, so they are stored and read exactly as
through SQLAlchemy.

It runs in the session's transaction, on the connection SQLAlchemy began (and will commit
or roll back); inside a savepoint it is part of the savepoint. ORM changes still pending
are flushed first, as `session.execute` would (autoflush), so writes keep their order. On
SQLite it goes through the connection's one-hop cursor (`sqlite_cursor`): on the event
loop's thread while the write turn is held, else one hand-off to the connection's thread.
Its errors are the ones SQLAlchemy would raise (`IntegrityError`, ...), so callers catch
what they caught before.

`pipelined(session)`: on PostgreSQL the statements run inside it are sent without waiting
for each one's answer (psycopg's pipeline mode); one that returns rows waits for its rows,
and so for everything sent before it. The writes a group commit makes at its end
(`write_behind.flush`), seven statements for one small file, then take two or three round
trips instead of seven. An error may then surface at a later statement or at the block's
end, as the SQLAlchemy error of the statement that failed first; the transaction is
aborted either way, as it would be without the pipeline.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import psycopg
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from services.common.driver_sql import (
    CompiledStatement,
    as_sqlalchemy_error,
    compile_statement,
    session_driver,
)

# `execute_many` of more rows than this goes through SQLAlchemy on PostgreSQL (one multi-row
# INSERT); a statement built per count of rows is worth it up to this many.
FEW_ROWS = 8
# session.info: psycopg's pipeline while `pipelined` runs.
_PIPELINE = "serentak.session_sql.pipeline"


@contextlib.asynccontextmanager
async def pipelined(session: AsyncSession) -> AsyncIterator[None]:
    """Statements run in `session` inside the block are pipelined on PostgreSQL (module
    docstring); on SQLite, or already inside, nothing changes."""
    if session.get_bind().dialect.name != "postgresql" or _PIPELINE in session.info:
        yield
        return
    await _autoflush(session)  # ORM writes check their rowcounts: before the pipeline
    connection, driver = await session_driver(session)
    try:
        async with driver.pipeline() as pipeline:
            session.info[_PIPELINE] = pipeline
            try:
                yield
            finally:
                del session.info[_PIPELINE]
    except psycopg.Error as exc:  # met at the block's end (its last statements)
        raise await as_sqlalchemy_error(connection, driver, exc, "(pipelined)", {}) from exc


class SessionStatement:
    """One Core statement (select, insert, update, delete, with or without RETURNING) run
    in a session's transaction on its driver connection (module docstring). `statement`
    may be a mapping of dialect name to statement, where the dialects need different ones
    (an upsert)."""

    def __init__(self, statement: Any) -> None:
        self._statement = statement
        self._compiled: dict[tuple[str, tuple[str, ...]], CompiledStatement] = {}

    def _statement_for(self, dialect: Dialect) -> Any:
        if isinstance(self._statement, Mapping):
            return self._statement[dialect.name]
        return self._statement

    def _for(self, dialect: Dialect, keys: tuple[str, ...]) -> CompiledStatement:
        found = self._compiled.get((dialect.name, keys))
        if found is None:
            found = compile_statement(self._statement_for(dialect), dialect, keys)
            self._compiled[(dialect.name, keys)] = found
        return found

    async def rows(
        self, session: AsyncSession, values: Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Every row the statement returns (tuples, in its columns' order)."""
        rows, _ = await self._run(session, values or {})
        return rows

    async def one(self, session: AsyncSession, values: Mapping[str, Any] | None = None) -> Any:
        """The statement's one row."""
        (row,) = await self.rows(session, values)
        return row

    async def first(self, session: AsyncSession, values: Mapping[str, Any] | None = None) -> Any:
        """The statement's first row, or None."""
        found = await self.rows(session, values)
        return found[0] if found else None

    async def later(self, session: AsyncSession, values: Mapping[str, Any] | None = None) -> Later:
        """The statement (one that returns rows) sent now, its rows read later
        (`Later.rows`): inside a `pipelined` block its answer comes with the block's end,
        with no round trip of its own; elsewhere it runs at once."""
        values = values or {}
        if session.info.get(_PIPELINE) is None:
            return Later(rows=await self.rows(session, values))
        compiled, connection, driver = await self._prepare(session, values)
        try:
            cursor = await driver.execute(compiled.sql, compiled.params(values))
        except psycopg.Error as exc:
            raise await as_sqlalchemy_error(connection, driver, exc, compiled.sql, values) from exc
        return Later(sent=(compiled, connection, driver, cursor, values))

    async def send(self, session: AsyncSession, values: Mapping[str, Any] | None = None) -> None:
        """Run a statement that returns no rows, its rowcount not needed: inside a
        `pipelined` block it is only sent (its errors come with a later answer)."""
        await self._run(session, values or {})

    async def execute(self, session: AsyncSession, values: Mapping[str, Any] | None = None) -> int:
        """Run a statement that returns no rows; the rows it matched (its rowcount)."""
        _, rowcount = await self._run(session, values or {}, count=True)
        return rowcount

    async def _run(
        self, session: AsyncSession, values: Mapping[str, Any], *, count: bool = False
    ) -> tuple[list[tuple[Any, ...]], int]:
        """Execute once with `values`: the rows returned (processed) and, if `count`, the
        rowcount (else -1 when pipelined: known only once its answer is read)."""
        compiled, connection, driver = await self._prepare(session, values)
        params = compiled.params(values)
        if connection.dialect.name == "sqlite":
            cursor = driver.cursor()
            try:
                await cursor.execute(compiled.sql, params)
            except sqlite3.Error as exc:
                raise _sqlite_error(connection, exc, compiled.sql, values) from exc
            return compiled.rows(await cursor.fetchall()), int(cursor.rowcount)
        pipeline = session.info.get(_PIPELINE)
        try:
            cursor = await driver.execute(compiled.sql, params)
            if pipeline is None:
                raw = await cursor.fetchall() if cursor.description else []
                return compiled.rows(raw), int(cursor.rowcount)
            if compiled.results:  # its rows: read once its answer is in
                return compiled.rows(await cursor.fetchall()), int(cursor.rowcount)
            if count:
                await pipeline.sync()
            return [], int(cursor.rowcount)
        except psycopg.Error as exc:
            raise await as_sqlalchemy_error(connection, driver, exc, compiled.sql, values) from exc

    async def execute_many(self, session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run the statement once per mapping in `rows` (all with the same keys). On
        PostgreSQL more than a few rows go through SQLAlchemy, whose multi-row INSERTs beat
        a statement a row, unless pipelined (each row's statement is then only sent);
        SQLite's executemany steps one prepared statement in C, which beats both."""
        if not rows:
            return
        compiled, connection, driver = await self._prepare(session, rows[0])
        sqlite = connection.dialect.name == "sqlite"
        if len(rows) > FEW_ROWS and not sqlite and _PIPELINE not in session.info:
            await session.execute(self._statement_for(connection.dialect), list(rows))
            return
        params = [compiled.params(row) for row in rows]
        if sqlite:
            cursor = driver.cursor()
            try:
                await cursor.executemany(compiled.sql, params)
            except sqlite3.Error as exc:
                raise _sqlite_error(connection, exc, compiled.sql, rows[0]) from exc
            return
        try:
            async with driver.cursor() as cursor:
                await cursor.executemany(compiled.sql, params)
        except psycopg.Error as exc:
            raise await as_sqlalchemy_error(connection, driver, exc, compiled.sql, rows[0]) from exc

    async def _prepare(
        self, session: AsyncSession, values: Mapping[str, Any]
    ) -> tuple[CompiledStatement, AsyncConnection, Any]:
        await _autoflush(session)
        connection, driver = await session_driver(session)
        return self._for(connection.dialect, tuple(sorted(values))), connection, driver


class Later:
    """A statement's rows, read once its answer is in (`SessionStatement.later`)."""

    __slots__ = ("_rows", "_sent")

    def __init__(
        self,
        *,
        rows: list[tuple[Any, ...]] | None = None,
        sent: tuple[CompiledStatement, AsyncConnection, Any, Any, Mapping[str, Any]] | None = None,
    ) -> None:
        self._rows = rows
        self._sent = sent

    async def rows(self) -> list[tuple[Any, ...]]:
        """Every row the statement returned (tuples, in its columns' order); read inside
        its pipeline, it waits for the answer (and everything sent before it)."""
        if self._sent is not None:
            compiled, connection, driver, cursor, values = self._sent
            try:
                raw = await cursor.fetchall()
            except psycopg.Error as exc:
                raise await as_sqlalchemy_error(
                    connection, driver, exc, compiled.sql, values
                ) from exc
            self._rows, self._sent = compiled.rows(raw), None
        return self._rows or []

    async def first(self) -> Any:
        """The statement's first row, or None."""
        found = await self.rows()
        return found[0] if found else None


async def _autoflush(session: AsyncSession) -> None:
    """Flush the session's pending ORM changes first, as `session.execute` would."""
    sync = session.sync_session
    if sync.autoflush and not sync._is_clean():
        await session.flush()


def _sqlite_error(
    connection: AsyncConnection, exc: sqlite3.Error, sql: str, values: Mapping[str, Any]
) -> BaseException:
    return DBAPIError.instance(
        sql, dict(values), exc, sqlite3.Error, hide_parameters=True, dialect=connection.dialect
    )


class SessionStatements:
    """One `SessionStatement` per count of items (rows of a multi-row INSERT, pairs of an
    IN list), built by `build(count)` when first asked for and kept."""

    def __init__(self, build: Callable[[int], Any]) -> None:
        self._build = build
        self._made: dict[int, SessionStatement] = {}

    def of(self, count: int) -> SessionStatement:
        """The statement for `count` items."""
        found = self._made.get(count)
        if found is None:
            found = self._made[count] = SessionStatement(self._build(count))
        return found

    def of_padded(
        self, values: dict[str, Any], names: Sequence[str], count: int
    ) -> SessionStatement:
        """The statement for an IN list of `count` items padded to a power of two, the
        rest of the list filled with copies of the last item (`{name}_{i}` in `values`,
        for each of `names`): the same rows match, and counts that vary from call to
        call (a relay round's) compile a few statements, not one per count."""
        size = 1 << (count - 1).bit_length()
        for i in range(count, size):
            for name in names:
                values[f"{name}_{i}"] = values[f"{name}_{count - 1}"]
        return self.of(size)
