"""A statement run on the session's psycopg connection (`driver_sql`) behaves as if
SQLAlchemy had run it: it is part of the session's transaction, its errors are
SQLAlchemy's, and a lost connection is invalidated so a rerun gets a fresh one."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DataError, DBAPIError
from support.postgres import terminate_other_sessions

from services.common.db import create_engine, is_disconnect, session_factory
from services.common.driver_sql import DriverStatement
from services.notify import database as notify_db
from services.notify.sql import retrying

LOCK = DriverStatement(
    text(
        "INSERT INTO notify_aggregate_versions (aggregate_id, applied_version)"
        " VALUES (:aggregate_id, 0) RETURNING applied_version"
    )
)
AS_INTEGER = DriverStatement(text("SELECT CAST(:value AS integer) AS n"))
COUNT = text("SELECT count(*) FROM notify_aggregate_versions WHERE aggregate_id = :a")


@pytest.fixture
async def sessions(postgres):
    url = postgres.create()
    notify_db.migrate(url)
    # As notify's own engine (components.py): no ping at checkout.
    engine = create_engine(url, pre_ping=False)
    try:
        yield session_factory(engine), url
    finally:
        await engine.dispose()


async def test_a_statement_commits_and_rolls_back_with_the_session(sessions) -> None:
    factory, _ = sessions
    async with factory() as session, session.begin():
        assert (await LOCK.one(session, {"aggregate_id": "kept"})).applied_version == 0
    with pytest.raises(RuntimeError):
        async with factory() as session, session.begin():
            await LOCK.one(session, {"aggregate_id": "undone"})
            raise RuntimeError("the transaction fails after the statement")
    async with factory() as session:
        assert await session.scalar(COUNT, {"a": "kept"}) == 1
        assert await session.scalar(COUNT, {"a": "undone"}) == 0


async def test_a_database_error_is_the_one_sqlalchemy_raises(sessions) -> None:
    factory, _ = sessions
    with pytest.raises(DataError) as refused:
        async with factory() as session, session.begin():
            await AS_INTEGER.one(session, {"value": "not a number"})
    assert refused.value.orig.sqlstate == "22P02"  # type: ignore[union-attr]
    assert not refused.value.connection_invalidated
    async with factory() as session, session.begin():  # the connection is still usable
        assert (await AS_INTEGER.one(session, {"value": "7"})).n == 7


async def test_a_lost_connection_is_invalidated_and_the_rerun_succeeds(sessions) -> None:
    factory, url = sessions
    async with factory() as session, session.begin():
        await AS_INTEGER.one(session, {"value": "1"})  # a pooled connection to lose
    assert terminate_other_sessions(url) >= 1

    failures: list[DBAPIError] = []

    async def transaction() -> int:
        async with factory() as session, session.begin():
            try:
                row = await AS_INTEGER.one(session, {"value": "5"})
            except DBAPIError as exc:
                failures.append(exc)
                raise
            return int(row.n)

    assert await retrying(transaction) == 5
    assert len(failures) == 1 and is_disconnect(failures[0])
