"""SQLite statements through SQLAlchemy cost one hand-off to the connection's thread, or
none in a write transaction (its BEGIN too, unless another process holds the write lock),
and read back exactly what aiosqlite's cursor gave: rows, rowcount, lastrowid, errors
(services/common/sqlite_cursor.py, db.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from services.common.db import create_engine, read_only, session_factory

metadata = MetaData()
items = Table(
    "items",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String, unique=True, nullable=False),
)


@pytest.fixture
async def engine(tmp_path: Path):
    engine = create_engine(f"sqlite:///{tmp_path / 'cursor.db'}")
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    yield engine
    await engine.dispose()


def _counting_hand_offs(driver) -> list[object]:  # type: ignore[no-untyped-def]
    """Record every call the driver hands to its connection's thread."""
    calls: list[object] = []
    real = driver._execute

    async def counted(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(fn)
        return await real(fn, *args, **kwargs)

    driver._execute = counted
    return calls


async def test_a_read_only_statement_is_one_hand_off_to_the_connections_thread(engine) -> None:
    async with session_factory(engine)() as session:
        await read_only(session)
        driver = (await (await session.connection()).get_raw_connection()).driver_connection
        driver._conn.create_function("thread_id", 0, threading.get_ident)
        calls = _counting_hand_offs(driver)
        try:
            rows = (await session.execute(select(items.c.id))).all()
            (thread,) = (await session.execute(text("SELECT thread_id()"))).one()
        finally:
            del driver._execute
    assert rows == []
    # One call a statement (aiosqlite's cursor took four), on the connection's thread:
    # a long read never holds up the event loop.
    assert len(calls) == 2
    assert thread != threading.get_ident()


async def test_a_write_transactions_statements_run_on_the_event_loops_thread(engine) -> None:
    async with engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        driver._conn.create_function("thread_id", 0, threading.get_ident)
        calls = _counting_hand_offs(driver)
        try:
            async with conn.begin():
                await conn.execute(insert(items).values(name="a"))
                await conn.execute(update(items).values(name="b"))
                (thread,) = (await conn.execute(text("SELECT thread_id()"))).one()
        finally:
            del driver._execute
    # Holding the process's writer turn, a statement runs where it is called: a hand-off
    # cost more than the statement. So does BEGIN IMMEDIATE, no other process holding the
    # write lock; the COMMIT (its fsync) hands off.
    assert thread == threading.get_ident()
    assert len(calls) == 1


async def test_a_big_write_still_goes_to_the_connections_thread(engine) -> None:
    async with engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        calls = _counting_hand_offs(driver)
        try:
            async with conn.begin():
                # A fan-out's multi-row insert, and a bulk executemany: not on the loop.
                await conn.execute(insert(items).values([{"name": f"a{i}"} for i in range(100)]))
                await conn.execute(insert(items), [{"name": f"b{i}"} for i in range(20)])
                await conn.execute(update(items).where(items.c.id == 1).values(name="x"))
        finally:
            del driver._execute
    # The two big writes, the COMMIT; BEGIN and the small update ran where they were called.
    assert len(calls) == 3


async def test_a_begin_that_meets_another_process_waits_off_the_loop(
    engine, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # Another process's writer (a plain sqlite3 connection) holds SQLite's write lock.
    other = sqlite3.connect(tmp_path / "cursor.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    async with engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        calls = _counting_hand_offs(driver)
        handed_off = asyncio.Event()
        counted = driver._execute

        async def noting(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
            handed_off.set()
            return await counted(fn, *args, **kwargs)

        driver._execute = noting

        async def write() -> None:
            async with conn.begin():
                await conn.execute(insert(items).values(name="after"))

        try:
            writing = asyncio.create_task(write())
            # The BEGIN went to the connection's thread to wait there: the loop runs on.
            await handed_off.wait()
            assert not writing.done()
            other.execute("ROLLBACK")
            await writing
        finally:
            del driver._execute
            other.close()
        # SQLite's busy handler is as it was before the try (the engine's 30 s).
        (waits,) = (await conn.execute(text("PRAGMA busy_timeout"))).one()
    assert waits == 30_000
    assert len(calls) == 2  # BEGIN (waited on the thread), COMMIT
    async with engine.connect() as conn:
        assert (await conn.execute(select(items.c.name))).scalars().all() == ["after"]


async def test_rows_counts_and_ids_read_as_through_aiosqlite(engine) -> None:
    async with engine.begin() as conn:
        first = await conn.execute(insert(items).values(name="a"))
        assert first.inserted_primary_key == (1,)  # lastrowid
        await conn.execute(insert(items), [{"name": "b"}, {"name": "c"}])  # executemany
        returned = (
            await conn.execute(insert(items).values(name="d").returning(items.c.id))
        ).scalar_one()
        assert returned == 4
        moved = await conn.execute(
            update(items).where(items.c.id > 2).values(name=items.c.name + "!")
        )
        assert moved.rowcount == 2
        result = await conn.execute(select(items.c.id, items.c.name).order_by(items.c.id))
        assert result.keys() == ["id", "name"]  # description
        assert result.fetchone() == (1, "a")
        assert result.fetchmany(2) == [(2, "b"), (3, "c!")]
        assert result.fetchall() == [(4, "d!")]


async def test_a_constraint_error_is_sqlalchemys_and_the_connection_goes_on(engine) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(items).values(name="a"))
    with pytest.raises(IntegrityError):
        async with engine.begin() as conn:
            await conn.execute(insert(items).values(name="a"))
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM items"))).scalar_one() == 1
