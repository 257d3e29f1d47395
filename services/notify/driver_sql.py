"""Ingest's hot PostgreSQL statements, run on the session's psycopg connection directly.

They are constant text already (`aggregate_lock`, `inbox_rows`, `fanout_batch`); what
SQLAlchemy still added per statement was its execution layers (ORM session, Core
connection, the async adapter's greenlet hop, result wrapping): ~0.33 ms of the event
loop's CPU per statement in an ad-hoc A/B on the project's VM, against ~0.5 ms for the
statement itself. The loop that runs Ingest also writes every open stream, so that CPU
is delivery latency.

Nothing else changes: the statement runs in the session's transaction (same connection,
committed or rolled back by the session), and its errors are SQLAlchemy's, as if it had
run it: a psycopg error is raised as the `DBAPIError` SQLAlchemy would raise, and a lost
connection is shown to SQLAlchemy, which invalidates it and the pool's other connections
(`connection_invalidated`), so `sql.retrying` reruns a deadlock or a lost connection as
before, on a fresh connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import TextClause
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

_DIALECT = PGDialect_psycopg()
_DRIVER = "serentak.driver_connection"  # session.info: (transaction, its connection, psycopg)


class DriverStatement:
    """A constant PostgreSQL statement, `clause` compiled once to psycopg's placeholders."""

    def __init__(self, clause: TextClause) -> None:
        self.sql = str(clause.compile(dialect=_DIALECT))

    async def rows(self, session: AsyncSession, parameters: Mapping[str, Any]) -> list[Any]:
        """Every row the statement returns (named tuples), run in `session`'s transaction."""
        connection, driver = await _driver(session)
        try:
            async with driver.cursor(row_factory=namedtuple_row) as cursor:
                await cursor.execute(self.sql, parameters)
                return await cursor.fetchall()
        except psycopg.Error as exc:
            raise await _as_sqlalchemy_error(connection, driver, exc, self.sql, parameters) from exc

    async def one(self, session: AsyncSession, parameters: Mapping[str, Any]) -> Any:
        """The statement's one row (named tuple)."""
        (row,) = await self.rows(session, parameters)
        return row


async def _driver(session: AsyncSession) -> tuple[AsyncConnection, psycopg.AsyncConnection]:
    # Looked up once per transaction: each lookup is a greenlet hop in SQLAlchemy.
    transaction = session.get_transaction()
    cached = session.info.get(_DRIVER)
    if cached is not None and cached[0] is transaction:
        return cached[1], cached[2]
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        raise TypeError(f"not a psycopg connection: {type(driver).__name__}")
    # Read again: `connection()` begins the transaction when there was none.
    session.info[_DRIVER] = (session.get_transaction(), connection, driver)
    return connection, driver


async def _as_sqlalchemy_error(
    connection: AsyncConnection,
    driver: psycopg.AsyncConnection,
    exc: psycopg.Error,
    sql: str,
    parameters: Mapping[str, Any],
) -> BaseException:
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
