"""A pooled PostgreSQL connection is pinged on checkout only when it has been idle for the
window: one the server dropped while idle is replaced before the transaction uses it, and
within the window no ping is sent, so a connection dropped just now is found by the
transaction's first statement, which fails as a lost connection, and the next transaction
runs on a fresh one."""

from __future__ import annotations

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

    def make(window_s: float):
        url = postgres.create()
        engine = create_async_engine(async_url(url), pool_size=1, max_overflow=0)
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
