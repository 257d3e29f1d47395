"""Group commit (services/common/group_commit.py): units that arrive together share one
transaction, with no savepoint until one of them fails; a unit that fails is rolled back
alone; every answer comes after the COMMIT."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, func, insert, select
from sqlalchemy.exc import IntegrityError
from support.group_commit import gathered
from support.tables import engine_with

from services.common.db import session_factory
from services.common.errors import Unavailable
from services.common.group_commit import CAREFUL_GROUPS, GroupCommits, shares_transaction
from services.common.session_sql import SessionStatement

metadata = MetaData()
things = Table(
    "group_commit_things",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
)


@pytest.fixture
async def sessions(database_url):
    async with engine_with(database_url, metadata) as engine:
        yield session_factory(engine)


def storing(groups: GroupCommits, name: str):
    async def work(session):
        await session.execute(insert(things).values(name=name))
        # Visible to the unit itself at once; to others only after the group commits.
        return await session.scalar(select(things.c.id).where(things.c.name == name))

    return groups.run(work)


async def test_racing_units_share_transactions_and_a_failing_one_fails_alone(sessions) -> None:
    commits: list[int] = []
    event.listen(sessions.kw["bind"].sync_engine, "commit", lambda conn: commits.append(1))
    sizes: list[int] = []
    groups = GroupCommits(sessions, max_group=16, on_group=sizes.append)
    names = [f"thing-{i}" for i in range(60)]
    # Every name once, and ten of them a second time: the second insert breaks UNIQUE.
    answers = await asyncio.gather(
        *(storing(groups, name) for name in names + names[:10]), return_exceptions=True
    )
    failed = [a for a in answers if isinstance(a, BaseException)]
    assert len(failed) == 10 and all(isinstance(a, IntegrityError) for a in failed)
    async with sessions() as session:
        stored = (await session.execute(select(things.c.name))).scalars().all()
        assert sorted(stored) == sorted(names)
        assert await session.scalar(select(func.count()).select_from(things)) == 60
    # The 60 stored units committed in fewer transactions than units (at most 16 a group).
    assert sum(sizes) == 60 and max(sizes) <= 16
    assert len(sizes) < 70 and len(commits) >= len(sizes)
    await groups.close()


INSERT_THING = SessionStatement(insert(things))


async def test_a_failing_unit_undoes_its_driver_statements_alone(sessions) -> None:
    """Statements run on the driver (`session_sql`) are inside the unit's savepoint too:
    every unit of a group, not only the first, gets its SAVEPOINT before them."""
    groups = GroupCommits(sessions, max_group=16)

    def unit(n: int):
        async def work(session):
            await INSERT_THING.execute(session, {"name": f"unit-{n}"})
            if n % 3 == 0:
                raise Unavailable(f"unit {n} refused after its write")
            return n

        return work

    answers = await gathered(groups, [unit(n) for n in range(12)])
    assert [isinstance(a, Unavailable) for a in answers] == [n % 3 == 0 for n in range(12)]
    async with sessions() as session:
        stored = set((await session.execute(select(things.c.name))).scalars())
    assert stored == {f"unit-{n}" for n in range(12) if n % 3}
    await groups.close()


async def test_an_answer_comes_only_after_the_commit(sessions) -> None:
    groups = GroupCommits(sessions)
    row_id = await storing(groups, "durable")
    # Another connection sees it at once: the answer came after the COMMIT.
    async with sessions() as session:
        found = await session.scalar(select(things.c.id).where(things.c.name == "durable"))
    assert found == row_id
    await groups.close()


async def test_after_close_units_are_refused_and_nothing_is_stored(sessions) -> None:
    groups = GroupCommits(sessions)
    await groups.close()
    with pytest.raises(Unavailable):
        await storing(groups, "late")
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(things)) == 0


async def test_a_group_runs_its_units_in_lock_order(sessions) -> None:
    """Units queued while a group commits run next, sorted by their `order`, so two
    replicas' groups take their locks in one global order."""
    groups = GroupCommits(sessions)
    ran: list[str] = []

    def unit(key: str):
        async def work(session):
            ran.append(key)

        return work

    keys = ["tenant-e", "tenant-c", "tenant-a", "tenant-d"]
    answers = await gathered(groups, [unit(k) for k in keys], [(k,) for k in keys])
    assert answers == [None] * 4
    assert ran == ["tenant-a", "tenant-c", "tenant-d", "tenant-e"]
    await groups.close()


async def test_a_unit_alone_fails_with_its_own_error_and_stores_nothing(sessions) -> None:
    groups = GroupCommits(sessions)

    async def refused(session):
        await session.execute(insert(things).values(name="half-done"))
        raise Unavailable("refused after a write")

    with pytest.raises(Unavailable, match="refused after a write"):
        await groups.run(refused)
    assert await storing(groups, "next") > 0  # the committer goes on
    async with sessions() as session:
        names = (await session.execute(select(things.c.name))).scalars().all()
    assert names == ["next"]
    await groups.close()


def savepoints_of(sessions) -> list[str]:
    """The SAVEPOINTs the engine begins from now on."""
    begun: list[str] = []
    engine = sessions.kw["bind"].sync_engine
    event.listen(engine, "savepoint", lambda conn, name: begun.append(name))
    return begun


async def test_a_group_with_no_failure_shares_its_transaction_without_savepoints(sessions):
    begun = savepoints_of(sessions)
    sizes: list[int] = []
    groups = GroupCommits(sessions, on_group=sizes.append)
    shared: list[bool] = []

    def unit(n: int):
        async def work(session):
            shared.append(shares_transaction(session))
            await INSERT_THING.execute(session, {"name": f"straight-{n}"})
            return n

        return work

    answers = await gathered(groups, [unit(n) for n in range(10)])
    assert answers == list(range(10))
    assert sizes == [1, 10] and begun == []
    assert shared == [True] * 10
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(things)) == 10
    await groups.close()


async def test_a_failure_undoes_the_group_and_the_others_run_again_in_savepoints(sessions):
    """The units before the failing one ran in the transaction rolled back; they run once
    more, each in a savepoint, and only that run is stored; the ones after it run once."""
    begun = savepoints_of(sessions)
    groups = GroupCommits(sessions)
    runs: dict[str, int] = {}

    def unit(name: str, fails: bool = False):
        async def work(session):
            runs[name] = runs.get(name, 0) + 1
            await INSERT_THING.execute(session, {"name": name})
            if fails:
                raise Unavailable(f"{name} refused after its write")
            return name

        return work

    answers = await gathered(groups, [unit("a"), unit("b"), unit("bad", True), unit("c")])
    assert answers[:2] == ["a", "b"] and answers[3] == "c"
    assert isinstance(answers[2], Unavailable)
    assert runs == {"a": 2, "b": 2, "bad": 1, "c": 1}
    assert len(begun) == 3  # a, b and c, each in its own
    async with sessions() as session:
        stored = sorted((await session.execute(select(things.c.name))).scalars())
    assert stored == ["a", "b", "c"]
    await groups.close()


async def test_after_a_failure_the_next_groups_take_savepoints_then_stop(sessions):
    begun = savepoints_of(sessions)
    groups = GroupCommits(sessions)

    def unit(name: str, fails: bool = False):
        async def work(session):
            await INSERT_THING.execute(session, {"name": name})
            if fails:
                raise Unavailable(f"{name} refused")

        return work

    await gathered(groups, [unit("first"), unit("refused", True)])
    assert len(begun) == 0  # the one left ran alone: no savepoint
    for n in range(CAREFUL_GROUPS + 1):
        begun.clear()
        await gathered(groups, [unit(f"group-{n}-a"), unit(f"group-{n}-b")])
        assert len(begun) == (2 if n < CAREFUL_GROUPS else 0)
    async with sessions() as session:
        count = await session.scalar(select(func.count()).select_from(things))
    assert count == 1 + 2 * (CAREFUL_GROUPS + 1)
    await groups.close()


async def test_a_unit_waiting_for_company_commits_with_the_next_unit(sessions) -> None:
    """Bookkeeping that may wait starts no group: it goes with the next unit's COMMIT."""
    sizes: list[int] = []
    groups = GroupCommits(sessions, on_group=sizes.append)

    def unit(name: str):
        async def work(session):
            await INSERT_THING.execute(session, {"name": name})
            return name

        return work

    waiting = asyncio.create_task(groups.run(unit("bookkeeping"), wait_for_company=3600))
    await asyncio.sleep(0)  # queued, and no group started for it
    assert sizes == [] and not waiting.done()
    async with asyncio.timeout(30):  # an hour's wait would fail here, not hang
        assert await groups.run(unit("write")) == "write"
        assert await waiting == "bookkeeping"
    assert sizes == [2]
    await groups.close()


async def test_a_unit_waiting_for_company_commits_alone_after_its_wait(sessions) -> None:
    sizes: list[int] = []
    groups = GroupCommits(sessions, on_group=sizes.append)

    async def work(session):
        await INSERT_THING.execute(session, {"name": "alone"})

    async with asyncio.timeout(30):
        await groups.run(work, wait_for_company=0.01)
    assert sizes == [1]
    async with sessions() as session:
        assert (await session.execute(select(things.c.name))).scalars().all() == ["alone"]
    await groups.close()
