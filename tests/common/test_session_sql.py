"""A statement run on the session's driver connection (`session_sql`) behaves as if
SQLAlchemy had run it, on SQLite and PostgreSQL: it is part of the session's transaction
and savepoints, stores and reads values as SQLAlchemy does, raises SQLAlchemy's errors,
and refuses what it cannot do as SQLAlchemy would (not doing it wrong). The ORM side is
`test_session_rows.py`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from support.tables import engine_with

from services.common.db import session_factory
from services.common.jobs.models import UtcDateTime
from services.common.session_sql import SessionStatement, SessionStatements, pipelined

metadata = MetaData()
notes = Table(
    "session_sql_notes",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("at", UtcDateTime, nullable=False),  # a TypeDecorator: both of its processors
    Column("detail", JSON, nullable=False),
    Column("done", Boolean, nullable=False),
    Column("count", Integer, nullable=False, default=7),
    Column("stamp", String(32), nullable=False, default=lambda: "computed"),
)

INSERT = SessionStatement(insert(notes))
BY_ID = SessionStatement(select(*notes.c).where(notes.c.id == bindparam("id", type_=String)))
COUNT = SessionStatement(select(func.count()).select_from(notes))
BUMP = SessionStatement(
    update(notes)
    .where(notes.c.id == bindparam("note", type_=String))
    .values(count=notes.c.count + 1)
    .returning(notes.c.count)
)
UNDONE = SessionStatement(
    update(notes).where(notes.c.id == bindparam("note", type_=String)).values(done=False)
)
AT = datetime(2026, 12, 6, 23, 30, 15, 250_000, tzinfo=UTC)


def note(id_: str, **extra: object) -> dict[str, object]:
    return {"id": id_, "at": AT, "detail": {"a": [1, "b"]}, "done": True, "stamp": "s", **extra}


@pytest.fixture
async def sessions(database_url):
    async with engine_with(database_url, metadata) as engine:
        yield session_factory(engine)


async def test_values_are_stored_and_read_as_sqlalchemy_does(sessions) -> None:
    async with sessions.begin() as session:
        await INSERT.execute(session, note("n1"))
    async with sessions() as session:
        orm = (await session.execute(select(notes).where(notes.c.id == "n1"))).one()
        driver = await BY_ID.one(session, {"id": "n1"})
    assert tuple(orm) == tuple(driver)
    assert driver[1] == AT and driver[2] == {"a": [1, "b"]} and driver[3] is True
    assert driver[4] == 7  # the column's constant default, filled in as SQLAlchemy would


async def test_it_commits_and_rolls_back_with_the_session_and_its_savepoints(sessions) -> None:
    async with sessions.begin() as session:
        await INSERT.execute(session, note("kept"))
        with pytest.raises(IntegrityError):
            async with session.begin_nested():
                await INSERT.execute(session, note("undone"))
                await INSERT.execute(session, note("kept"))  # the primary key again
        assert (await BUMP.one(session, {"note": "kept"}))[0] == 8
    with pytest.raises(RuntimeError):
        async with sessions.begin() as session:
            await INSERT.execute(session, note("rolled back"))
            raise RuntimeError("the transaction fails after the statement")
    async with sessions() as session:
        assert (await COUNT.one(session))[0] == 1
        assert (await BY_ID.one(session, {"id": "kept"}))[4] == 8


async def test_a_constraint_error_is_sqlalchemys_and_the_transaction_goes_on(sessions) -> None:
    async with sessions.begin() as session:
        await INSERT.execute(session, note("n1"))
    async with sessions.begin() as session:
        with pytest.raises(IntegrityError):
            async with session.begin_nested():
                await INSERT.execute(session, note("n1"))
        await INSERT.execute(session, note("n2"))
    async with sessions() as session:
        assert (await COUNT.one(session))[0] == 2


async def test_many_rows_go_in_one_call_and_more_through_sqlalchemy(sessions) -> None:
    few = [note(f"few-{i}") for i in range(3)]
    many = [note(f"many-{i}") for i in range(40)]
    async with sessions.begin() as session:
        await INSERT.execute_many(session, few)
        await INSERT.execute_many(session, many)
        await INSERT.execute_many(session, [])
    async with sessions() as session:
        assert (await COUNT.one(session))[0] == 43
        assert (await BY_ID.one(session, {"id": "many-39"}))[4] == 7


async def test_pipelined_statements_keep_their_order_rows_and_counts(sessions) -> None:
    # Sent without waiting on PostgreSQL: a statement that returns rows still sees all
    # sent before it, an asked-for rowcount is the real one, and what is stored is what
    # the same statements store one by one.
    async with sessions.begin() as session, pipelined(session):
        await INSERT.execute_many(session, [note(f"p-{i:02}") for i in range(12)])  # > FEW_ROWS
        assert (await BUMP.one(session, {"note": "p-03"}))[0] == 8
        assert await UNDONE.execute(session, {"note": "p-04"}) == 1
        assert await UNDONE.execute(session, {"note": "absent"}) == 0
        await UNDONE.send(session, {"note": "p-05"})  # only sent: no count asked for
        await INSERT.execute(session, note("p-last"))
        assert (await COUNT.one(session))[0] == 13
    async with sessions() as session:
        assert (await COUNT.one(session))[0] == 13
        assert (await BY_ID.one(session, {"id": "p-03"}))[4] == 8
        assert tuple(await BY_ID.one(session, {"id": "p-04"}))[1:4] == (AT, {"a": [1, "b"]}, False)
        assert (await BY_ID.one(session, {"id": "p-05"}))[3] is False


async def test_a_pipelined_constraint_error_is_sqlalchemys_and_nothing_is_stored(sessions) -> None:
    async with sessions.begin() as session:
        await INSERT.execute(session, note("taken"))
    # Met at the block's end on PostgreSQL (the statement itself on SQLite).
    with pytest.raises(IntegrityError):
        async with sessions.begin() as session, pipelined(session):
            await INSERT.execute(session, note("fresh"))
            await INSERT.execute(session, note("taken"))
    # Met at a later statement's rows.
    with pytest.raises(IntegrityError):
        async with sessions.begin() as session, pipelined(session):
            await INSERT.execute(session, note("taken"))
            await COUNT.one(session)
    async with sessions.begin() as session, pipelined(session):  # the connection goes on
        await INSERT.execute(session, note("after"))
    async with sessions() as session:
        assert await BY_ID.first(session, {"id": "fresh"}) is None
        assert (await COUNT.one(session))[0] == 2  # "taken" and "after"


async def test_a_read_sent_later_gives_what_a_read_at_once_gives(sessions) -> None:
    async with sessions.begin() as session:
        await INSERT.execute_many(session, [note("l-1"), note("l-2")])
    async with sessions.begin() as session:
        at_once = [await BY_ID.rows(session, {"id": "l-1"}), await COUNT.rows(session)]
        unpipelined = await BY_ID.later(session, {"id": "l-1"})  # runs at once
        async with pipelined(session):
            answers = [await BY_ID.later(session, {"id": "l-1"}), await COUNT.later(session)]
            await INSERT.execute(session, note("l-3"))  # sent after: not in the count
        assert [await answer.rows() for answer in answers] == at_once
        assert await unpipelined.rows() == at_once[0]
        assert await answers[1].first() == at_once[1][0]
        assert (await COUNT.one(session))[0] == 3
    # A read that fails is SQLAlchemy's error, at the block's end or at its rows.
    with pytest.raises(DBAPIError):
        async with sessions() as session:
            async with pipelined(session):
                failing = await SessionStatement(text("SELECT * FROM no_such_table")).later(session)
            await failing.rows()


async def test_what_it_cannot_do_is_refused_not_done_wrong(sessions) -> None:
    async with sessions.begin() as session:
        # A computed default SQLAlchemy would call per row: refused, not stored as NULL.
        with pytest.raises(TypeError, match="stamp"):
            await INSERT.execute(session, {k: v for k, v in note("n").items() if k != "stamp"})
        # An expanding IN, which SQLAlchemy renders per execution.
        expanding = SessionStatement(select(notes.c.id).where(notes.c.id.in_(["a", "b"])))
        with pytest.raises(TypeError, match="IN list"):
            await expanding.rows(session)


BY_IDS = SessionStatements(
    lambda n: (
        select(notes.c.id)
        .where(notes.c.id.in_([bindparam(f"id_{i}", type_=String) for i in range(n)]))
        .order_by(notes.c.id)
    )
)


async def test_a_padded_in_list_matches_the_same_rows_with_few_statements(sessions) -> None:
    async with sessions.begin() as session:
        await INSERT.execute_many(session, [note(f"n{i:02d}") for i in range(40)])
    async with sessions() as session:
        for count in range(1, 40):
            wanted = [f"n{i:02d}" for i in range(count)]
            values = {f"id_{i}": id_ for i, id_ in enumerate(wanted)}
            statement = BY_IDS.of_padded(values, ("id",), count)
            assert [id_ for (id_,) in await statement.rows(session, values)] == wanted
    assert sorted(BY_IDS._made) == [1, 2, 4, 8, 16, 32, 64]
