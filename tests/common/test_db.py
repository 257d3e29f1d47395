"""SQLite connections close, whatever state a cancelled statement left them in.

A background loop cancelled at shutdown mid-statement gets its connection terminated by
SQLAlchemy (aiosqlite's `stop()`); a later `close()` of that connection, from the pool or
from the loop's own shutdown, must return instead of awaiting a thread that has left
(CI: a test's teardown hung for 300 s on exactly that).
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("ending", ["closed", "terminated"])
async def test_closing_mid_transaction_releases_the_write_lock_despite_unfetched_rows(
    tmp_path: Path, ending: str
) -> None:
    # A statement returning rows (INSERT .. RETURNING, the job claim) whose await is
    # cancelled before its rows are fetched leaves its cursor active; SQLAlchemy then
    # terminates the connection (graceful close, else stop()). Python's sqlite3 closed it
    # as a "zombie" that kept the transaction, and the write lock, for as long as that
    # cursor lived (the cancellation's traceback holds it): a stopping worker's hand-back
    # of its job waited out the 30 s busy timeout behind it (notify, CI).
    path = str(tmp_path / "t.db")
    connection = await connect_sqlite(path)
    await connection.execute("PRAGMA journal_mode=WAL")
    await connection.execute("CREATE TABLE t (x INTEGER)")
    await connection.commit()
    await connection.execute("BEGIN IMMEDIATE")
    unfetched = await connection.execute("INSERT INTO t VALUES (1) RETURNING x")
    if ending == "closed":
        await connection.close()
    else:
        connection.stop()
        await asyncio.to_thread(connection._thread.join, 10)
        assert not connection._thread.is_alive()
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # "database is locked" at once if still held
        assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)  # rolled back
        other.execute("ROLLBACK")
    finally:
        other.close()
    del unfetched


@pytest.mark.parametrize("ending", ["terminated", "dropped unclosed"])
def test_a_connection_ended_without_awaiting_stops_its_thread_cleanly_after_its_loop_closed(
    tmp_path: Path, ending: str
) -> None:
    # SQLAlchemy's terminate (stop(), never awaited) at shutdown, or a leaked connection
    # collected in a later test: aiosqlite's stop answered the closed loop, and its worker
    # thread died on RuntimeError.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # as pytest-asyncio leaves a finished test's loop
    died: list[threading.ExceptHookArgs] = []
    previous, threading.excepthook = threading.excepthook, died.append
    try:
        connection = loop.run_until_complete(connect_sqlite(str(tmp_path / "t.db")))
        thread = connection._thread
        if ending == "terminated":
            busy = threading.Event()
            connection._tx.put_nowait((None, busy.wait))  # the thread is mid-statement
            connection.stop()
            loop.close()
            busy.set()
        else:
            loop.close()
            with pytest.warns(ResourceWarning):
                del connection
                gc.collect()
        thread.join(10)
    finally:
        threading.excepthook = previous
        asyncio.set_event_loop(None)
    assert not thread.is_alive()
    assert died == []


def test_a_statement_finishing_after_its_loop_closed_leaves_the_thread_serving(
    tmp_path: Path,
) -> None:
    # A statement still running when its test's loop closed (say, waiting out the busy
    # timeout): aiosqlite's worker died answering the closed loop, and every statement
    # queued behind it was never run.
    loop = asyncio.new_event_loop()
    died: list[threading.ExceptHookArgs] = []
    previous, threading.excepthook = threading.excepthook, died.append
    try:
        connection = loop.run_until_complete(connect_sqlite(str(tmp_path / "t.db")))
        thread = connection._thread
        busy = threading.Event()
        abandoned = loop.create_future()
        connection._tx.put_nowait((abandoned, busy.wait))  # mid-statement
        loop.close()
        busy.set()
        ran = threading.Event()
        connection._tx.put_nowait((None, ran.set))  # queued behind the abandoned one
        assert ran.wait(10)
        connection.stop()
        thread.join(10)
    finally:
        threading.excepthook = previous
    assert not thread.is_alive()
    assert died == []
    assert not abandoned.done()
