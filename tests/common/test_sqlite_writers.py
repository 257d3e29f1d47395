"""A process's SQLite writers take turns in front of SQLite's write lock: none sleeps in
SQLite's busy handler behind another of the same process, a turn is handed on first come
first served, a turn not had in time fails as SQLite would, and a transaction that ends
any way gives its turn back (services/common/sqlite_writers.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, event, select, text, update
from sqlalchemy.exc import OperationalError

from services.common.db import create_engine, session_factory
from services.common.sqlite_writers import WriterTurn

metadata = MetaData()
counters = Table(
    "counters",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("value", Integer, nullable=False),
)


@pytest.fixture
async def engine(tmp_path: Path):
    engine = create_engine(f"sqlite:///{tmp_path / 'writers.db'}")

    @event.listens_for(engine.sync_engine, "connect")
    def no_busy_wait(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        # SQLite's busy handler off: a BEGIN IMMEDIATE that meets another connection's
        # write lock fails at once instead of sleeping it out.
        dbapi_connection.driver_connection  # noqa: B018 (the adapter is made)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=0")
        cursor.close()

    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(counters.insert().values(id=1, value=0))
    yield engine
    await engine.dispose()


async def test_writers_of_one_process_never_meet_sqlites_write_lock(engine) -> None:  # type: ignore[no-untyped-def]
    sessions = session_factory(engine)

    async def increment() -> None:
        async with sessions() as session, session.begin():
            (value,) = (await session.execute(select(counters.c.value))).one()
            await asyncio.sleep(0)  # let the other writers run between the read and the write
            await session.execute(update(counters).values(value=value + 1))

    # With the busy handler off, any two of these overlapping in SQLite would fail.
    await asyncio.gather(*(increment() for _ in range(60)))
    async with sessions() as session:
        assert (await session.execute(select(counters.c.value))).scalar_one() == 60


async def test_the_busy_handler_is_off_in_these_tests(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Another process's writer (here a plain sqlite3 connection) still meets SQLite's lock.
    other = sqlite3.connect(tmp_path / "writers.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            async with session_factory(engine)() as session, session.begin():
                await session.execute(text("SELECT 1"))
    finally:
        other.execute("ROLLBACK")
        other.close()
    async with session_factory(engine)() as session, session.begin():  # the turn came back
        await session.execute(update(counters).values(value=7))


async def test_turns_are_handed_on_first_come_first_served(tmp_path: Path) -> None:
    path = str(tmp_path / "turns.db")
    holder = WriterTurn(path)
    await holder.take(1.0)
    order: list[int] = []

    async def writer(n: int) -> None:
        turn = WriterTurn(path)
        await turn.take(5.0)
        order.append(n)
        await asyncio.sleep(0)  # others run while this one holds the turn
        turn.give_back()

    tasks = []
    for n in range(8):
        tasks.append(asyncio.create_task(writer(n)))
        await asyncio.sleep(0)  # this writer is now in line
    holder.give_back()
    await asyncio.gather(*tasks)
    assert order == list(range(8))


async def test_a_turn_not_had_in_time_fails_as_sqlite_would(tmp_path: Path) -> None:
    path = str(tmp_path / "turns.db")
    holder, waiter = WriterTurn(path), WriterTurn(path)
    await holder.take(1.0)
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        await waiter.take(0.05)
    holder.give_back()
    await waiter.take(1.0)  # handed on once given back
    waiter.give_back()
    # Another file, and an in-memory database, have turns of their own.
    await WriterTurn(str(tmp_path / "other.db")).take(0.05)
    await WriterTurn(":memory:").take(0.05)


async def test_a_turn_given_back_from_another_thread_is_handed_on(tmp_path: Path) -> None:
    path = str(tmp_path / "turns.db")
    holder, waiter = WriterTurn(path), WriterTurn(path)
    await holder.take(1.0)
    # A terminated connection may be collected on any thread.
    await asyncio.to_thread(holder.give_back)
    await waiter.take(5.0)
    waiter.give_back()


async def test_a_cancelled_transaction_gives_its_turn_back(engine) -> None:  # type: ignore[no-untyped-def]
    sessions = session_factory(engine)
    inside = asyncio.Event()

    async def stuck() -> None:
        async with sessions() as session, session.begin():
            await session.execute(update(counters).values(value=1))
            inside.set()
            await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(stuck())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with sessions() as session, session.begin():
        await session.execute(update(counters).values(value=2))
    async with sessions() as session:
        assert (await session.execute(select(counters.c.value))).scalar_one() == 2
