"""A pooled PostgreSQL connection is pinged on checkout only when it has been idle for the
window: one the server dropped while idle is replaced before the transaction uses it, and
within the window no ping is sent, so a connection dropped just now is found by the
transaction's first statement, which fails as a lost connection, and the next transaction
runs on a fresh one. Once one is found lost, the others are pinged before their next use
(a server that dropped one dropped them all), also when it was found on the driver
connection, as the chunk reader finds it."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from support.postgres import terminate_other_sessions

from services.common.db import async_url, is_disconnect
from services.common.pool_pings import ping_when_idle

ONE = text("SELECT 1")


async def backend_pid(engine) -> int:
    async with engine.connect() as connection:
        return int(await connection.scalar(text("SELECT pg_backend_pid()")))


@pytest.fixture
async def engine_for(postgres):
    made = []

    def make(window_s: float, size: int = 1):
        url = postgres.create()
        engine = create_async_engine(async_url(url), pool_size=size, max_overflow=0)
        ping_when_idle(engine.sync_engine, window_s)
        made.append(engine)
        return engine, url

    yield make
    for engine in made:
        await engine.dispose()


async def test_a_connection_dropped_while_idle_is_replaced_before_use(engine_for) -> None:
    engine, url = engine_for(0.0)  # every checkout is past the window
    first = await backend_pid(engine)
    assert terminate_other_sessions(url) == 1
    # The ping finds the pooled connection dead: the transaction runs on a new one.
    assert await backend_pid(engine) != first


async def test_within_the_window_no_ping_is_sent(engine_for) -> None:
    engine, url = engine_for(3600.0)  # every checkout is within the window
    await backend_pid(engine)
    assert terminate_other_sessions(url) == 1
    with pytest.raises(DBAPIError) as lost:
        async with engine.connect() as connection:
            await connection.execute(ONE)
    assert is_disconnect(lost.value)  # found by the statement: no ping replaced it
    async with engine.connect() as connection:  # SQLAlchemy replaced the pool's connections
        assert await connection.scalar(ONE) == 1


async def test_once_one_is_found_lost_the_others_are_pinged(engine_for) -> None:
    engine, url = engine_for(3600.0, size=2)  # two pooled connections, both used just now
    async with engine.connect() as first, engine.connect() as second:
        pids = {
            await first.scalar(text("SELECT pg_backend_pid()")),
            await second.scalar(text("SELECT pg_backend_pid()")),
        }
    assert len(pids) == 2
    assert terminate_other_sessions(url) == 2
    # Found on the driver connection (no SQLAlchemy statement to invalidate the pool):
    # the holder invalidates just that one, as the chunk reader does.
    connection = await engine.connect()
    driver = (await connection.get_raw_connection()).driver_connection
    with pytest.raises(psycopg.OperationalError):
        await driver.execute("SELECT 1")
    await connection.invalidate()
    await connection.close()
    # The other, dropped too and used within the window, is pinged and replaced.
    assert await backend_pid(engine) not in pids
