"""Rows read and written by driver statements stay the ORM session's rows (`session_rows`),
as SQLAlchemy's own query and flush keep them: one object per key, nothing left to flush,
pending changes flushed before a statement, and a rolled-back insert leaves its object new
with its values (not a detached object that cannot be read)."""

from __future__ import annotations

import pytest
from sqlalchemy import Integer, String, bindparam, event, insert, inspect, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from support.tables import engine_with

from services.common.db import session_factory
from services.common.session_rows import (
    insert_values,
    inserted,
    loaded,
    new_object,
    refreshed,
    updated,
)
from services.common.session_sql import SessionStatement


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "session_rows_items"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer, default=0)


ITEMS = Item.__table__
BY_ID = SessionStatement(select(*ITEMS.c).where(ITEMS.c.id == bindparam("id", type_=String)))
INSERT = SessionStatement(insert(ITEMS))
GROW = SessionStatement(
    update(ITEMS).where(ITEMS.c.id == bindparam("item", type_=String)).values(size=ITEMS.c.size + 1)
)


@pytest.fixture
async def sessions(database_url):
    async with engine_with(database_url, Base.metadata) as engine:
        statements: list[str] = []
        event.listen(
            engine.sync_engine,
            "before_cursor_execute",
            lambda *a: statements.append(a[2].split()[0]),
        )
        yield session_factory(engine), statements


async def add(sessions, item_id: str, size: int = 1) -> None:
    async with sessions.begin() as session:
        session.add(Item(id=item_id, name=item_id, size=size))


async def test_a_row_read_is_the_sessions_object_for_its_key(sessions) -> None:
    factory, statements = sessions
    await add(factory, "a")
    async with factory.begin() as session:
        held = await session.get(Item, "a")
        found = loaded(session, Item, await BY_ID.one(session, {"id": "a"}))
        assert found is held
        fresh = loaded(session, Item, (await BY_ID.one(session, {"id": "a"})))
        assert fresh is held
    async with factory.begin() as session:
        item = loaded(session, Item, await BY_ID.one(session, {"id": "a"}))
        assert (item.id, item.name, item.size) == ("a", "a", 1)
        assert await session.get(Item, "a") is item  # no second read: it is the session's
        statements.clear()
        await session.flush()
        assert statements == []  # nothing to write: the database holds these values
        session.expire(item, ["size"])
        assert loaded(session, Item, await BY_ID.one(session, {"id": "a"})).size == 1


async def test_pending_orm_changes_are_flushed_before_a_statement(sessions) -> None:
    factory, _ = sessions
    async with factory.begin() as session:
        session.add(Item(id="pending", name="p", size=3))
        assert (await BY_ID.one(session, {"id": "pending"}))[2] == 3


async def test_an_inserted_object_is_persistent_and_a_rollback_makes_it_new_again(
    sessions,
) -> None:
    factory, statements = sessions
    kept = Item(id="kept", name="k")
    undone = Item(id="undone", name="u", size=5)
    async with factory.begin() as session:
        values = insert_values(kept)
        assert values["size"] == 0 and kept.size == 0  # the constant default, as a flush
        await INSERT.execute(session, values)
        inserted(session, kept)
        assert await session.get(Item, "kept") is kept
        with pytest.raises(RuntimeError):
            async with session.begin_nested():
                await INSERT.execute(session, insert_values(undone))
                inserted(session, undone)
                raise RuntimeError("the savepoint is rolled back")
        statements.clear()
        await session.flush()
        assert statements == []
    # Rolled back: a new object again, its values still readable after the session.
    assert (undone.id, undone.name, undone.size) == ("undone", "u", 5)
    async with factory() as session:
        assert await session.get(Item, "undone") is None
        assert (await session.get(Item, "kept")).size == 0


async def test_an_update_shows_on_the_object_the_session_holds(sessions) -> None:
    factory, statements = sessions
    await add(factory, "b", size=1)
    async with factory.begin() as session:
        item = await session.get(Item, "b")
        await GROW.execute(session, {"item": "b"})
        updated(session, Item, "b", {"size": 2})
        updated(session, Item, "not held", {"size": 9})  # nothing to show it on
        assert item.size == 2
        row = await BY_ID.one(session, {"id": "b"})
        assert refreshed(session, Item, (*row[:2], 40)) is item and item.size == 40
        statements.clear()
        await session.flush()
        assert statements == []


async def test_an_object_made_by_new_object_is_as_the_constructor_makes_it(sessions) -> None:
    factory, _ = sessions
    made = new_object(Item, {"id": "made", "name": "m"})
    built = Item(id="made", name="m")
    assert inspect(made).transient
    assert {k: getattr(made, k) for k in ("id", "name", "size")} == {
        k: getattr(built, k) for k in ("id", "name", "size")
    }
    assert insert_values(made) == insert_values(built)
    made.name = "renamed"  # a later set records its history as usual
    assert inspect(made).attrs.name.history.added == ["renamed"]
    # Added to a session and flushed by the ORM, or inserted by a statement: the same row.
    async with factory.begin() as session:
        session.add(made)
    async with factory() as session:
        assert (await session.get(Item, "made")).name == "renamed"
    with pytest.raises(TypeError, match="colour"):
        new_object(Item, {"id": "x", "name": "x", "colour": "red"})
