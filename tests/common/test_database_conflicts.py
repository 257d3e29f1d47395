"""A deadlock PostgreSQL breaks is TRANSACTION_CONFLICT (ABORTED, retry), and a database
connection lost mid-call DATABASE_UNAVAILABLE (UNAVAILABLE, retry): neither is INTERNAL."""

from __future__ import annotations

import asyncio

import grpc
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from support.postgres import terminate_other_sessions

from services.common.database_conflicts import (
    DatabaseUnavailable,
    TransactionConflict,
    as_connection_lost,
    as_transaction_conflict,
)
from services.common.db import create_engine
from services.common.rpc_status import account_error, status_name


async def test_a_real_deadlock_is_a_retryable_conflict(postgres) -> None:
    url = make_url(postgres.create()).set(drivername="postgresql")
    dsn = url.render_as_string(hide_password=False)
    first = await psycopg.AsyncConnection.connect(dsn)
    second = await psycopg.AsyncConnection.connect(dsn)
    both_hold = asyncio.Barrier(2)

    async def cross(conn: psycopg.AsyncConnection, mine: int, theirs: int) -> BaseException | None:
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (mine,))
                await both_hold.wait()
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (theirs,))
        except psycopg.Error as exc:
            return exc
        return None

    try:
        outcomes = await asyncio.gather(cross(first, 1, 2), cross(second, 2, 1))
    finally:
        await first.close()
        await second.close()
    broken = [exc for exc in outcomes if exc is not None]
    assert len(broken) == 1, outcomes  # PostgreSQL breaks the cycle by failing one side
    found = as_transaction_conflict(broken[0])
    assert isinstance(found, TransactionConflict)
    assert (found.code, found.reason) == (grpc.StatusCode.ABORTED, "TRANSACTION_CONFLICT")
    assert status_name(broken[0]) == "ABORTED"


def test_other_database_errors_are_not_conflicts() -> None:
    assert as_transaction_conflict(psycopg.errors.UniqueViolation("dup")) is None
    assert as_transaction_conflict(ValueError("no")) is None


async def test_a_lost_database_connection_is_unavailable(postgres) -> None:
    url = postgres.create()
    engine = create_engine(url, pre_ping=False)  # the statement finds the loss, as in a call
    try:
        async with engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
        assert terminate_other_sessions(url) == 1
        with pytest.raises(DBAPIError) as lost:
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
    found = as_connection_lost(lost.value)
    assert isinstance(found, DatabaseUnavailable)
    assert (found.code, found.reason) == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
    assert status_name(lost.value) == "UNAVAILABLE"
    assert isinstance(account_error(lost.value, "UploadFile"), DatabaseUnavailable)
    assert as_connection_lost(psycopg.errors.UniqueViolation("dup")) is None
