"""A service disposes of its pool only once every checked-out connection is back
(`dispose_when_returned`): a session still closing at shutdown is checked in first, not
left for the garbage collector; one never returned is waited for only `grace_seconds`,
and the log says how many were out. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import structlog
from sqlalchemy import event, text

from services.common.db import create_engine, dispose_when_returned


def record_order(engine, order: list[str]) -> None:
    """Append "checkin" when a connection goes back to `engine`'s pool, "disposed" when
    the engine disposes of its pool."""
    event.listen(engine.sync_engine.pool, "checkin", lambda *_: order.append("checkin"))
    event.listen(engine.sync_engine, "engine_disposed", lambda *_: order.append("disposed"))


async def test_dispose_waits_for_a_connection_still_closing(database_url: str) -> None:
    engine = create_engine(database_url)
    order: list[str] = []
    record_order(engine, order)
    connection = await engine.connect()
    await connection.execute(text("SELECT 1"))
    disposing = asyncio.create_task(dispose_when_returned(engine, grace_seconds=60))
    # One turn of the loop: the task runs up to its wait (without it, to the dispose).
    await asyncio.sleep(0)
    assert order == []
    await connection.close()
    await disposing
    assert order == ["checkin", "disposed"]


async def test_dispose_with_nothing_out_does_not_wait(database_url: str) -> None:
    engine = create_engine(database_url)
    order: list[str] = []
    record_order(engine, order)
    async with engine.connect() as connection:
        await connection.execute(text("SELECT 1"))
    with structlog.testing.capture_logs() as logs:
        await dispose_when_returned(engine, grace_seconds=60)
    assert order == ["checkin", "disposed"]
    assert [e for e in logs if e["event"] == "db_connections_not_returned"] == []


async def test_a_connection_never_returned_is_waited_for_only_the_grace_and_logged(
    database_url: str,
) -> None:
    engine = create_engine(database_url)
    order: list[str] = []
    record_order(engine, order)
    connection = await engine.connect()
    await connection.execute(text("SELECT 1"))
    with structlog.testing.capture_logs() as logs:
        await dispose_when_returned(engine, grace_seconds=0.05)
    assert order == ["disposed"]
    assert [(e["event"], e["checked_out"]) for e in logs] == [("db_connections_not_returned", 1)]
    await connection.close()  # into the disposed pool: closed, nothing left behind
    assert order == ["disposed", "checkin"]
