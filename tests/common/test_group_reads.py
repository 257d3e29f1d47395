"""Group reads (services/common/group_reads.py): a run of units that declare a read is read
for at once, and every unit still gets the answer it would have read itself."""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from support.group_commit import gathered
from support.tables import engine_with

from services.common import group_reads
from services.common.db import session_factory
from services.common.errors import Unavailable
from services.common.group_commit import GroupCommits
from services.common.session_sql import SessionStatement

metadata = MetaData()
names = Table(
    "group_reads_names",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
)
INSERT_NAME = SessionStatement(insert(names))


class Holders:
    """Which names are taken: name -> row id or None, every read it made recorded."""

    def __init__(self) -> None:
        self.reads: list[list[str]] = []

    async def read(self, session, keys):
        self.reads.append(list(keys))
        found = await session.execute(
            select(names.c.name, names.c.id).where(names.c.name.in_(keys))
        )
        held = dict(found.all())
        return {key: held.get(key) for key in keys}


@pytest.fixture
async def sessions(database_url):
    async with engine_with(database_url, metadata) as engine:
        yield session_factory(engine)


def asking(holders: Holders, name: str):
    async def work(session):
        return await group_reads.read(session, holders, name)

    return work


async def test_a_run_of_units_that_declare_a_read_is_read_for_at_once(sessions) -> None:
    async with sessions.begin() as session:
        await INSERT_NAME.execute(session, {"name": "b"})
    taken = {"b": 1}
    holders = Holders()
    groups = GroupCommits(sessions)
    asked = ["a", "b", "c", "b", "d"]
    answers = await gathered(
        groups,
        [asking(holders, name) for name in asked],
        reads=[{holders: name} for name in asked],
    )
    assert answers == [taken.get(name) for name in asked]
    assert holders.reads == [["a", "b", "c", "d"]]  # one read, each name once
    await groups.close()


async def test_after_a_unit_that_declares_no_reads_the_next_read_again(sessions) -> None:
    """A unit that declared no reads may write straight: the units after it see its row."""
    holders = Holders()
    groups = GroupCommits(sessions)

    async def writes_straight(session):
        return await group_reads.read(session, holders, "late") or await INSERT_NAME.execute(
            session, {"name": "late"}
        )

    answers = await gathered(
        groups,
        [asking(holders, "late"), writes_straight, asking(holders, "late")],
        reads=[{holders: "late"}, None, {holders: "late"}],
    )
    first, _, after = answers
    assert first is None and isinstance(after, int)
    # The first unit's read, the undeclared unit's own, and the third's: none kept across.
    assert holders.reads == [["late"], ["late"], ["late"]]
    await groups.close()


async def test_units_in_savepoints_or_alone_read_for_themselves(sessions) -> None:
    """After a failed unit the next groups run each unit in a savepoint, whose writes the
    next unit must see: nothing is read for it ahead."""
    holders = Holders()
    groups = GroupCommits(sessions)

    def claiming(name: str, fail: bool = False):
        async def work(session):
            holder = await group_reads.read(session, holders, name)
            if fail:
                raise Unavailable("refused")
            if holder is None:
                await INSERT_NAME.execute(session, {"name": name})
            return holder

        return work

    failed, *_ = await gathered(
        groups, [claiming("x", fail=True), claiming("y")], reads=[{holders: "x"}, {holders: "y"}]
    )
    assert isinstance(failed, Unavailable)
    holders.reads.clear()
    answers = await gathered(
        groups, [claiming("z"), claiming("z")], reads=[{holders: "z"}, {holders: "z"}]
    )
    assert answers[0] is None and isinstance(answers[1], int)  # saw the first one's row
    assert holders.reads == [["z"], ["z"]]
    holders.reads.clear()
    assert await groups.run(asking(holders, "y"), reads={holders: "y"}) is not None
    assert holders.reads == [["y"]]
    await groups.close()
