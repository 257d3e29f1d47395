"""Jobs two or more behind their partition's head wait ('waiting'), and the next is
queued when the job ahead goes: claims never walk a deep partition, and order never
depends on it."""

from __future__ import annotations

import asyncio
import time

import pytest
from alembic import command
from common.jobs.racing_workers import PartitionOrder, running
from sqlalchemy import select, text

from services.common.db import create_engine
from services.common.jobs import JobContext, JobRegistry, NewJob, Worker, enqueue
from services.common.jobs.completions import CompletionBatcher
from services.common.jobs.dead_letters import dead_letter
from services.common.jobs.models import jobs, utcnow
from services.common.jobs.queue import claim_jobs, complete, promote_stranded
from services.common.jobs.stats import queue_stats
from services.common.migrate import alembic_config
from services.common.runtime_migrations import migration_location

DEADLINE_S = 60.0


async def _statuses(db) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """idempotency key -> status of every unfinished job."""
    async with db.sessions() as session, session.begin():
        rows = await session.execute(select(jobs.c.idempotency_key, jobs.c.status))
        return {key: status for key, status in rows}


async def _claim(db, limit: int = 10):  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        return await claim_jobs(session, "w", ["t"], 30.0, limit=limit)


async def _enqueue(db, *keys: str) -> None:  # type: ignore[no-untyped-def]
    """One job per key, partition = the key's first letter, in one transaction."""
    async with db.sessions() as session, session.begin():
        for key in keys:
            await enqueue(session, NewJob("t", {}, key[0], key))


async def test_a_job_two_or_more_behind_its_partitions_head_waits(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _enqueue(runtime_db, "a0", "a1", "b0", "a2")
    await _enqueue(runtime_db, "a3")
    assert await _statuses(runtime_db) == {
        "a0": "queued",
        "a1": "queued",  # right behind the head: see runtime_0003 for why not 'waiting'
        "a2": "waiting",
        "a3": "waiting",
        "b0": "queued",
    }


async def _run_head(db) -> str:  # type: ignore[no-untyped-def]
    """Claim and complete the oldest head; its idempotency key."""
    (head,) = await _claim(db, limit=1)
    async with db.sessions() as session, session.begin():
        await complete(session, head)
    return str(head.idempotency_key)


async def test_deleting_the_job_ahead_queues_the_next_waiting_one(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _enqueue(runtime_db, "a0", "a1", "a2", "a3")
    assert await _run_head(runtime_db) == "a0"
    assert await _statuses(runtime_db) == {"a1": "queued", "a2": "waiting", "a3": "waiting"}
    assert await _run_head(runtime_db) == "a1"
    assert await _statuses(runtime_db) == {"a2": "queued", "a3": "waiting"}
    assert [j.idempotency_key for j in await _claim(runtime_db)] == ["a2"]


async def test_dead_lettering_the_job_ahead_queues_the_next_one(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _enqueue(runtime_db, "a0", "a1", "a2")
    assert await _run_head(runtime_db) == "a0"
    (head,) = await _claim(runtime_db)
    async with runtime_db.sessions() as session, session.begin():
        assert await dead_letter(session, head, ValueError("bad payload"), "w")
    assert await _statuses(runtime_db) == {"a2": "queued"}


async def test_a_batch_completion_queues_the_next_job_of_every_freed_partition(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _enqueue(runtime_db, "a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2", "c3")
    for _ in range(3):
        await _run_head(runtime_db)  # a0, b0, c0: a1, b1, c1 head their partitions
    heads = await _claim(runtime_db)
    batcher = CompletionBatcher(runtime_db.sessions)
    batcher.keep_connection()
    try:
        assert await asyncio.gather(*(batcher.complete(j, None) for j in heads)) == [True] * 3
    finally:
        await batcher.close()
    assert batcher.batches <= 2  # the first job alone, then the rest in one statement
    assert await _statuses(runtime_db) == {
        "a2": "queued",
        "b2": "queued",
        "c2": "queued",
        "c3": "waiting",
    }


async def test_a_claim_skips_a_deep_partition_and_takes_the_other_heads(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _enqueue(runtime_db, *(f"h{i}" for i in range(300)))
    (held,) = await _claim(runtime_db, limit=1)  # h0 runs elsewhere; 299 wait behind it
    await _enqueue(runtime_db, "x0", "y0", "z0", "x1")
    batch = await _claim(runtime_db)
    assert held.idempotency_key == "h0"
    assert [j.idempotency_key for j in batch] == ["x0", "y0", "z0"]


async def test_claim_order_does_not_depend_on_the_waiting_status(runtime_db) -> None:  # type: ignore[no-untyped-def]
    # Every job of a partition 'queued' (as before runtime_0003, or after a downgrade and
    # upgrade): only the first may run.
    await _enqueue(runtime_db, "a0", "a1", "a2")
    async with runtime_db.sessions() as session, session.begin():
        await session.execute(text("UPDATE jobs SET status = 'queued'"))
    assert [j.idempotency_key for j in await _claim(runtime_db)] == ["a0"]
    assert await _claim(runtime_db) == []


async def test_concurrent_enqueues_into_an_empty_partition_run_in_id_order(runtime_db) -> None:  # type: ignore[no-untyped-def]
    if runtime_db.dialect != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time")
    first, second = runtime_db.sessions(), runtime_db.sessions()
    try:
        await first.begin()
        await enqueue(first, NewJob("t", {}, "a", "a-first"))  # takes the smaller id
        async with second.begin():
            await enqueue(second, NewJob("t", {}, "a", "a-second"))  # sees no job ahead
        await first.commit()
    finally:
        await first.close()
        await second.close()
    assert await _statuses(runtime_db) == {"a-first": "queued", "a-second": "queued"}
    assert [j.idempotency_key for j in await _claim(runtime_db)] == ["a-first"]


async def test_a_head_stranded_by_a_racing_enqueue_is_queued_by_the_sweep(runtime_db) -> None:  # type: ignore[no-untyped-def]
    if runtime_db.dialect != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing to race")
    await _enqueue(runtime_db, "a0", "a1")
    # The enqueue sees two jobs ahead (so 'waiting'); both run and are deleted before it
    # commits, so the last deletion's promotion cannot see the new job.
    enqueuing = runtime_db.sessions()
    try:
        await enqueuing.begin()
        await enqueue(enqueuing, NewJob("t", {}, "a", "a2"))
        assert await _run_head(runtime_db) == "a0"
        assert await _run_head(runtime_db) == "a1"
        await enqueuing.commit()
    finally:
        await enqueuing.close()
    assert await _statuses(runtime_db) == {"a2": "waiting"}
    assert await _claim(runtime_db) == []  # stranded: nothing ahead of it, yet not queued
    ran: list[str] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.idempotency_key)

    registry = JobRegistry()
    registry.register("t", handler)
    assert await Worker(runtime_db.sessions, registry, worker_id="w").run_once()
    assert ran == ["a2"]
    async with runtime_db.sessions() as session, session.begin():
        assert await promote_stranded(session) == 0


async def test_racing_enqueues_and_completions_run_every_job_once_in_order(runtime_db) -> None:  # type: ignore[no-untyped-def]
    # One producer per partition commits its jobs one by one while workers complete the
    # heads: enqueues race the promotions of the jobs ahead of them.
    partitions, per = 6, 25
    recorder = PartitionOrder()

    async def produce(p: int) -> None:
        for i in range(per):
            async with runtime_db.sessions() as session, session.begin():
                await enqueue(session, NewJob("t", {"i": i}, f"p{p}", f"p{p}:{i}"))
            await asyncio.sleep(0)

    registry = JobRegistry()
    registry.register("t", recorder.handler)
    workers = [
        Worker(runtime_db.sessions, registry, worker_id=f"w{n}", poll_interval=0.05)
        for n in range(3)
    ]
    async with running(workers):
        await asyncio.gather(*(produce(p) for p in range(partitions)))
        deadline = time.monotonic() + DEADLINE_S
        while recorder.ran() < partitions * per:
            assert time.monotonic() < deadline, f"ran {recorder.order} by the deadline"
            await asyncio.sleep(0.05)  # polling an observable condition
    assert recorder.overlaps == []
    assert recorder.order == {f"p{p}": list(range(per)) for p in range(partitions)}


async def test_waiting_jobs_count_as_queued_in_the_stats(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _enqueue(runtime_db, "a0", "a1", "a2", "a3", "b0")
    await _claim(runtime_db, limit=1)
    async with runtime_db.sessions() as session, session.begin():
        (stats,) = (await queue_stats(session)).job_types
    assert (stats.queued, stats.running) == (4, 1)


async def test_migration_marks_jobs_behind_a_head_waiting_and_back(database_url: str) -> None:
    cfg = alembic_config(database_url, *migration_location())
    command.upgrade(cfg, "runtime_0002")
    engine = create_engine(database_url)
    try:
        async with engine.begin() as conn:
            for n, key in enumerate(("a0", "a1", "b0", "a2", "a3")):
                await conn.execute(jobs.insert().values(_row(n, key)))
        command.upgrade(cfg, "head")
        async with engine.begin() as conn:
            rows = await conn.execute(select(jobs.c.idempotency_key, jobs.c.status))
            assert {key: status for key, status in rows} == {
                "a0": "queued",
                "a1": "queued",
                "b0": "queued",
                "a2": "waiting",
                "a3": "waiting",
            }
        command.downgrade(cfg, "runtime_0002")
        async with engine.begin() as conn:
            rows = await conn.execute(select(jobs.c.status).distinct())
            assert list(rows.scalars()) == ["queued"]
    finally:
        await engine.dispose()


def _row(n: int, key: str) -> dict[str, object]:
    """A queued job as runtime_0002 stored every job."""
    now = utcnow()
    return {
        "job_id": f"j{n}",
        "job_type": "t",
        "partition_key": key[0],
        "idempotency_key": key,
        "payload": {},
        "correlation_id": "",
        "status": "queued",
        "attempts": 0,
        "collapsed": 0,
        "run_after": now,
        "enqueued_at": now,
    }
