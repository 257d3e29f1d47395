"""SQLite connections close, whatever state a cancelled statement left them in.

A background loop cancelled at shutdown mid-statement gets its connection terminated by
SQLAlchemy (aiosqlite's `stop()`); a later `close()` of that connection, from the pool or
from the loop's own shutdown, must return instead of awaiting a thread that has left
(CI: a test's teardown hung for 300 s on exactly that).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import text

from services.common.db import connect_sqlite, create_engine, session_factory


async def test_close_after_terminate_returns(tmp_path: Path) -> None:
    connection = await connect_sqlite(str(tmp_path / "t.db"))
    connection.stop()  # SQLAlchemy's force-close of a terminated connection
    async with asyncio.timeout(10):
        await connection.close()
    assert not connection._running


async def test_close_completes_queued_work_and_stops_the_thread(tmp_path: Path) -> None:
    connection = await connect_sqlite(str(tmp_path / "t.db"))
    await connection.execute("CREATE TABLE t (x INTEGER)")
    async with asyncio.timeout(10):
        await connection.close()
        await connection.close()  # twice is harmless
    await asyncio.to_thread(connection._thread.join, 10)
    assert not connection._thread.is_alive()


async def test_a_statement_cancelled_behind_the_write_lock_lets_the_engine_close(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'w.db'}")
    sessions = session_factory(engine)
    async with sessions() as setup, setup.begin():
        await setup.execute(text("CREATE TABLE t (x INTEGER)"))
    holder = sessions()
    await holder.execute(text("INSERT INTO t VALUES (1)"))  # BEGIN IMMEDIATE: holds the lock
    waiting = asyncio.Event()

    async def writer() -> None:
        async with sessions() as session:
            waiting.set()
            # Suspended in an aiosqlite call on its own connection when the test cancels
            # it: checkout, pragmas, or BEGIN IMMEDIATE waiting for the holder's lock.
            await session.execute(text("INSERT INTO t VALUES (2)"))

    task = asyncio.create_task(writer())
    await waiting.wait()
    task.cancel()  # as a stop cancels a background loop
    await holder.rollback()
    await holder.close()
    async with asyncio.timeout(60):
        await asyncio.gather(task, return_exceptions=True)
        await engine.dispose()
    assert task.cancelled() or task.exception() is not None
