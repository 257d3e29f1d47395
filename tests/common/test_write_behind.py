"""Writes behind (services/common/write_behind.py): in a group commit, what the units write
for nobody in the transaction to read back goes in one write a kind, at the group's end,
in the order written; a failed unit's is never stored; outside a group it is written at
once."""

from __future__ import annotations

import asyncio
import functools

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.exc import IntegrityError
from support.tables import engine_with

from services.common import write_behind
from services.common.db import session_factory
from services.common.group_commit import GroupCommits
from services.common.session_sql import SessionStatement

metadata = MetaData()
trail = Table(
    "write_behind_trail",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
)


class CountedRows(write_behind.Rows):
    """Rows of the trail, counting the writes (each one statement)."""

    def __init__(self) -> None:
        super().__init__(SessionStatement(insert(trail)))
        self.writes: list[int] = []

    async def write(self, session, items) -> None:  # type: ignore[no-untyped-def]
        self.writes.append(len(items))
        await super().write(session, items)


@pytest.fixture
async def sessions(database_url):
    async with engine_with(database_url, metadata) as engine:
        yield session_factory(engine)


async def _names(sessions) -> list[str]:  # type: ignore[no-untyped-def]
    async with sessions() as session:
        return list((await session.execute(select(trail.c.name).order_by(trail.c.id))).scalars())


async def one_group(groups: GroupCommits, works: list) -> list:  # type: ignore[type-arg]
    """Run `works` as one group (queued while a blocker holds the flusher)."""
    started, release = asyncio.Event(), asyncio.Event()

    async def blocker(session):  # type: ignore[no-untyped-def]
        started.set()
        await release.wait()

    first = asyncio.create_task(groups.run(blocker))
    await started.wait()
    tasks = [asyncio.create_task(groups.run(work, (f"{i:03}",))) for i, work in enumerate(works)]
    await asyncio.sleep(0)  # one turn of the loop: each task queues its unit
    release.set()
    await first
    return await asyncio.gather(*tasks, return_exceptions=True)


def writing(rows: CountedRows, *names: str, fail: bool = False):  # type: ignore[no-untyped-def]
    async def work(session) -> str:  # type: ignore[no-untyped-def]
        for name in names:
            await write_behind.write(session, rows, {"name": name})
        if fail:
            raise LookupError("refused after writing behind")
        return names[0]

    return work


async def test_a_groups_writes_behind_go_in_one_write_in_the_order_written(sessions) -> None:
    rows = CountedRows()
    groups = GroupCommits(sessions)
    answers = await one_group(groups, [writing(rows, f"u{i}-a", f"u{i}-b") for i in range(6)])
    assert answers == [f"u{i}-a" for i in range(6)]
    assert rows.writes == [12]  # one statement for the six units' twelve rows
    assert await _names(sessions) == [f"u{i}-{s}" for i in range(6) for s in "ab"]


async def test_a_failed_units_writes_behind_are_not_stored(sessions) -> None:
    rows = CountedRows()
    groups = GroupCommits(sessions)
    works = [writing(rows, f"u{i}", fail=i == 2) for i in range(5)]
    answers = await one_group(groups, works)
    assert isinstance(answers[2], LookupError)
    assert [a for i, a in enumerate(answers) if i != 2] == ["u0", "u1", "u3", "u4"]
    assert await _names(sessions) == ["u0", "u1", "u3", "u4"]
    # The next groups run their units in savepoints: each unit's rows written in its own.
    later = await one_group(groups, [writing(rows, "v0"), writing(rows, "v1", fail=True)])
    assert later[0] == "v0" and isinstance(later[1], LookupError)
    assert await _names(sessions) == ["u0", "u1", "u3", "u4", "v0"]


async def test_a_write_behind_that_fails_fails_its_own_unit_only(sessions) -> None:
    rows = CountedRows()
    groups = GroupCommits(sessions)
    # The third unit's row takes the first's name: the group's one write breaks UNIQUE.
    works = [writing(rows, "same"), writing(rows, "other"), writing(rows, "same")]
    answers = await one_group(groups, works)
    assert answers[:2] == ["same", "other"] and isinstance(answers[2], IntegrityError)
    assert sorted(await _names(sessions)) == ["other", "same"]


async def test_outside_a_group_a_write_is_made_at_once(sessions) -> None:
    rows = CountedRows()
    async with sessions() as session, session.begin():
        await write_behind.write(session, rows, {"name": "now"})
        assert await session.scalar(select(func.count()).select_from(trail)) == 1
    assert rows.writes == [1]


async def test_a_unit_sees_what_earlier_units_wrote_behind_and_not_yet_written(sessions) -> None:
    rows = CountedRows()
    groups = GroupCommits(sessions)
    seen: list[list[str]] = []

    def looking(name: str):  # type: ignore[no-untyped-def]
        async def work(session) -> str:  # type: ignore[no-untyped-def]
            seen.append([item["name"] for item in write_behind.pending(session, rows)])
            await write_behind.write(session, rows, {"name": name})
            return name

        return work

    await one_group(groups, [looking("a"), looking("b"), looking("c")])
    assert seen == [[], ["a"], ["a", "b"]]  # pending: written behind, in the order written
    async with sessions() as session, session.begin():
        assert write_behind.pending(session, rows) == []  # outside a group: nothing waits


class ReadBack:
    """A batch whose rows' ids are read back once the flush's statements are answered."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    async def write(self, session, items) -> None:  # type: ignore[no-untyped-def]
        for item in items:
            answer = await INSERT_RETURNING.later(session, item)
            self.events.append(("sent", item["name"]))
            await write_behind.when_answered(
                session, functools.partial(self._answered, answer, item["name"])
            )

    async def _answered(self, answer, name: str) -> None:  # type: ignore[no-untyped-def]
        (row_id,) = await answer.first()
        self.events.append(("answered", name, row_id))


INSERT_RETURNING = SessionStatement(insert(trail).returning(trail.c.id))


async def test_a_batchs_answers_are_read_once_every_write_of_the_flush_is_sent(sessions) -> None:
    read_back, rows = ReadBack(), CountedRows()
    groups = GroupCommits(sessions)

    def unit(name: str):  # type: ignore[no-untyped-def]
        async def work(session) -> None:  # type: ignore[no-untyped-def]
            await write_behind.write(session, read_back, {"name": name})
            await write_behind.write(session, rows, {"name": f"{name}-row"})

        return work

    await one_group(groups, [unit("a"), unit("b")])
    async with sessions() as session:
        ids = dict((await session.execute(select(trail.c.name, trail.c.id))).all())
    # Both sent, then (after the other batch's rows too) both answers, with the stored ids.
    assert read_back.events == [
        ("sent", "a"),
        ("sent", "b"),
        ("answered", "a", ids["a"]),
        ("answered", "b", ids["b"]),
    ]
    assert rows.writes == [2]
    # Outside a flush the answer is read at once.
    async with sessions() as session, session.begin():
        await write_behind.write(session, read_back, {"name": "alone"})
    assert read_back.events[-2:][0] == ("sent", "alone")
    assert read_back.events[-1][:2] == ("answered", "alone")
