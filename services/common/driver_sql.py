"""Statements compiled once for a dialect and run straight on the driver connection.

The hot paths (the chunk read and the group commit's writes in upload's ingest; Ingest's
aggregate lock, inbox insert and fan-out in notify) skip SQLAlchemy's per-execution work on
the event loop: its execution layers (ORM session, Core connection, the async adapter's
greenlet hop, result wrapping) cost ~0.33 ms of loop CPU per statement against ~0.5 ms for
the statement itself on PostgreSQL, and on aiosqlite a cursor costs four thread hand-offs
where `execute_fetchall` costs one. What SQLAlchemy would still do for them is done here,
once: the statement is compiled for the engine's dialect (psycopg's unless told), and
values pass through the columns' own bind and result processors, so they are stored and
read exactly as through SQLAlchemy.

Two ways to run one:
- `run(driver, values)`: on a driver connection the caller keeps checked out (aiosqlite or
  psycopg); rows as lists with the result processors applied.
- `rows(session, values)` / `one(...)`: on the session's own psycopg connection, in its
  transaction (committed or rolled back by the session); named-tuple rows. Its errors are
  SQLAlchemy's, as if it had run it: a psycopg error is raised as the `DBAPIError`
  SQLAlchemy would raise, and a lost connection is shown to SQLAlchemy, which invalidates
  it and the pool's other connections (`connection_invalidated`), so `sql.retrying` reruns
  a deadlock or a lost connection as before, on a fresh connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Column
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

_DIALECT: Dialect = PGDialect_psycopg()  # type: ignore[no-untyped-call]
_DRIVER = "serentak.driver_connection"  # session.info: (transaction, its connection, psycopg)


_Processor = Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class CompiledStatement:
    """A statement compiled for one dialect (and one set of value names): its SQL, the
    order of its parameters and the processors of its bound values and its columns."""

    sql: str
    names: list[str] | None  # positional order (SQLite's qmark), or None (named)
    binds: dict[str, _Processor]
    literals: dict[str, Any]
    results: list[_Processor]

    def params(self, values: Mapping[str, Any]) -> Any:
        """`values` (by bind name) processed and in the driver's parameter form."""
        processed = {
            name: value if (p := self.binds.get(name)) is None else p(value)
            for name, value in values.items()
        }
        processed.update(self.literals)
        return processed if self.names is None else [processed[n] for n in self.names]

    def rows(self, raw: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """Driver rows with each column's result processor applied."""
        if not any(self.results):
            return [tuple(row) for row in raw]
        return [
            tuple(v if p is None else p(v) for v, p in zip(row, self.results, strict=True))
            for row in raw
        ]


def compile_statement(
    statement: Any,
    dialect: Dialect,
    keys: Sequence[str] = (),
    binds: Mapping[str, Column[Any]] | None = None,
    returns: Sequence[Any] | None = None,
) -> CompiledStatement:
    """`statement` compiled for `dialect`, with `keys` the names of the values given at
    execution (an INSERT's or UPDATE's columns among them). Bound values are processed as
    their types say (or, given `binds`, only those, as those columns' types say), returned
    columns as theirs (or `returns`'); constant defaults of columns not given are filled in.
    Refused: a column default computed per row, an expanding IN (rendered per execution)."""
    compiled = statement.compile(dialect=dialect, column_keys=list(keys))
    if compiled.post_compile_params:
        raise TypeError(f"{statement}: an IN list is expanded per execution; spell it out")
    if binds is None:
        processors = {
            name: bind.type.dialect_impl(dialect).bind_processor(dialect)
            for name, bind in compiled.binds.items()
        }
    else:
        processors = {
            name: column.type.dialect_impl(dialect).bind_processor(dialect)
            for name, column in binds.items()
        }
    given = set(keys) | set(binds or ())
    # The statement's own literals (e.g. a status), bound under generated names.
    literals = {
        k: v
        for k, v in compiled.params.items()
        if k not in given and not compiled.binds[k].required
    }
    # Columns not given whose default SQLAlchemy would fill in: a constant is filled in
    # here; a computed one (a function) must be given, or it would be stored as NULL.
    for column in [*compiled.insert_prefetch, *compiled.update_prefetch]:
        default = column.default if column in compiled.insert_prefetch else column.onupdate
        if default is None or not default.is_scalar:
            raise TypeError(f"{statement}: give {column.key!r}, its default is computed")
        literals[column.key] = default.arg
    literals = {k: (v if (p := processors.get(k)) is None else p(v)) for k, v in literals.items()}
    types = (
        [c.type for c in returns]
        if returns is not None
        else [entry[3] for entry in compiled._result_columns]
    )
    results = [t.dialect_impl(dialect).result_processor(dialect, None) for t in types]
    names = list(compiled.positiontup or []) if compiled.positional else None
    return CompiledStatement(str(compiled), names, processors, literals, results)


class DriverStatement:
    """One statement compiled for a dialect (`compile_statement`), run on a driver
    connection the caller holds, or on a session's psycopg connection. Its bound values
    are processed by the `binds` given (by name), its rows by the `returns` columns. A
    `text()` clause's `:names` pass through as given."""

    def __init__(
        self,
        statement: Any,
        dialect: Dialect = _DIALECT,
        binds: dict[str, Column[Any]] | None = None,
        returns: Sequence[Any] = (),
    ) -> None:
        self._compiled = compile_statement(statement, dialect, (), binds or {}, returns)
        self.sql = self._compiled.sql
        self._sqlite = dialect.name == "sqlite"

    def params(self, values: Mapping[str, Any]) -> Any:
        """`values` (by bind name) processed and in the driver's parameter form."""
        return self._compiled.params(values)

    def _processed(self, raw: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """Driver rows with each column's result processor applied."""
        return [list(row) for row in self._compiled.rows(raw)]

    async def run(self, driver: Any, values: Mapping[str, Any]) -> list[list[Any]]:
        """Execute on `driver` (aiosqlite or psycopg connection); the processed rows."""
        params = self.params(values)
        if self._sqlite:
            # aiosqlite: execute and fetch in one hand-off to its thread.
            return self._processed(list(await driver.execute_fetchall(self.sql, params)))
        cursor = await driver.execute(self.sql, params)
        return self._processed(await cursor.fetchall())

    async def rows(self, session: AsyncSession, parameters: Mapping[str, Any]) -> list[Any]:
        """Every row the statement returns (named tuples), run in `session`'s transaction
        on its psycopg connection."""
        connection, driver = await _driver(session)
        try:
            async with driver.cursor(row_factory=namedtuple_row) as cursor:
                await cursor.execute(self.sql, self.params(parameters))
                return await cursor.fetchall()
        except psycopg.Error as exc:
            raise await as_sqlalchemy_error(connection, driver, exc, self.sql, parameters) from exc

    async def one(self, session: AsyncSession, parameters: Mapping[str, Any]) -> Any:
        """The statement's one row (named tuple)."""
        (row,) = await self.rows(session, parameters)
        return row


async def _driver(session: AsyncSession) -> tuple[AsyncConnection, psycopg.AsyncConnection]:
    connection, driver = await session_driver(session)
    if not isinstance(driver, psycopg.AsyncConnection):
        raise TypeError(f"not a psycopg connection: {type(driver).__name__}")
    return connection, driver


async def session_driver(session: AsyncSession) -> tuple[AsyncConnection, Any]:
    """The session's connection (its transaction begun, and its savepoint, inside
    `begin_nested`) and the driver connection under it (psycopg's, or aiosqlite's)."""
    # Looked up once per transaction and per savepoint: each lookup is a greenlet hop in
    # SQLAlchemy. The savepoint counts: SQLAlchemy emits SAVEPOINT only when the nested
    # transaction first asks for its connection, so a statement run on the driver before
    # that would not be rolled back with it.
    sync = session.sync_session
    transaction = sync.get_nested_transaction() or sync.get_transaction()
    cached = session.info.get(_DRIVER)
    if cached is not None and cached[0] is transaction:
        return cached[1], cached[2]
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    # Read again: `connection()` begins the transaction when there was none.
    transaction = sync.get_nested_transaction() or sync.get_transaction()
    session.info[_DRIVER] = (transaction, connection, driver)
    return connection, driver


async def as_sqlalchemy_error(
    connection: AsyncConnection,
    driver: psycopg.AsyncConnection,
    exc: psycopg.Error,
    sql: str,
    parameters: Mapping[str, Any],
) -> BaseException:
    """The error SQLAlchemy would raise for `exc` from `sql` on `connection`; a lost
    connection is first shown to SQLAlchemy, which invalidates it (module docstring)."""
    if driver.closed or driver.broken:  # lost: SQLAlchemy's psycopg dialect's own test
        # SQLAlchemy is shown the lost connection on a statement of its own: it then
        # invalidates it and the pool's other connections, as if it had run this one.
        try:
            await connection.exec_driver_sql("SELECT 1")
        except DBAPIError as seen:
            return seen
    return DBAPIError.instance(
        sql, dict(parameters), exc, psycopg.Error, hide_parameters=True, dialect=connection.dialect
    )
