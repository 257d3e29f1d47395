"""A deadlock PostgreSQL breaks is TRANSACTION_CONFLICT (ABORTED, retry), not INTERNAL."""

from __future__ import annotations

import asyncio

import grpc
import psycopg
from sqlalchemy.engine import make_url

from services.common.database_conflicts import TransactionConflict, as_transaction_conflict
from services.common.rpc_status import status_name


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
