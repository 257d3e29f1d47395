"""Batch claims: several jobs per round trip, never two of one partition, order kept."""

from __future__ import annotations

import asyncio
import time

from common.jobs.racing_workers import PartitionOrder, running
from sqlalchemy import func, select

from services.common.jobs import JobContext, JobRegistry, NewJob, Worker, enqueue
from services.common.jobs.idempotency import record_applied
from services.common.jobs.models import applied_jobs, jobs
from services.common.jobs.queue import claim_jobs

DEADLINE_S = 60.0


async def _count(db, table) -> int:  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        return (await session.execute(select(func.count()).select_from(table))).scalar_one()


async def test_a_batch_takes_only_partition_heads_oldest_first(runtime_db) -> None:  # type: ignore[no-untyped-def]
    async with runtime_db.sessions() as session, session.begin():
        for i in range(3):
            for p in ("a", "b", "c"):
                await enqueue(session, NewJob("t", {"i": i}, p, f"{p}{i}"))
    async with runtime_db.sessions() as session, session.begin():
        batch = await claim_jobs(session, "w", ["t"], 30.0, limit=10)
    assert [(j.partition_key, j.payload["i"]) for j in batch] == [("a", 0), ("b", 0), ("c", 0)]
    assert [j.id for j in batch] == sorted(j.id for j in batch)
    async with runtime_db.sessions() as session, session.begin():
        assert await claim_jobs(session, "w2", ["t"], 30.0, limit=10) == []


async def test_claim_reports_an_already_applied_key_and_the_handler_never_runs(runtime_db) -> None:  # type: ignore[no-untyped-def]
    runs: list[str] = []

    async def handler(ctx: JobContext) -> None:
        runs.append(ctx.idempotency_key)

    registry = JobRegistry()
    registry.register("t", handler)
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "a", "done-key"))
        await enqueue(session, NewJob("t", {}, "b", "fresh-key"))
    async with runtime_db.sessions() as session, session.begin():
        first, second = await claim_jobs(session, "w", ["t"], 30.0, limit=2)
    # Apply the first key behind the claim's back, then claim it again after the lease.
    async with runtime_db.sessions() as session, session.begin():
        await record_applied(session, first, {"by": "elsewhere"})
    assert not first.already_applied and not second.already_applied
    worker = Worker(runtime_db.sessions, registry, worker_id="w")
    await worker.execute(first)  # the insert finds the key taken: acknowledged, no effect
    await worker.execute(second)
    assert runs == ["done-key", "fresh-key"]  # ran, but only the fresh key's effect commits
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "c", "done-key"))
        (again,) = await claim_jobs(session, "w", ["t"], 30.0, limit=5)
    assert again.already_applied
    await worker.execute(again)
    assert runs == ["done-key", "fresh-key"]  # acknowledged by the claim's probe
    assert await _count(runtime_db, jobs) == 0
    assert await _count(runtime_db, applied_jobs) == 2


async def test_racing_batch_workers_apply_each_job_once_in_partition_order(runtime_db) -> None:  # type: ignore[no-untyped-def]
    partitions, per = 12, 10
    recorder = PartitionOrder()
    registry = JobRegistry()
    registry.register("t", recorder.handler)
    for _round in range(3):
        recorder.order.clear()
        async with runtime_db.sessions() as session, session.begin():
            for i in range(per):
                for p in range(partitions):
                    await enqueue(session, NewJob("t", {"i": i}, f"p{p}", f"{_round}:p{p}:{i}"))
        workers = [
            Worker(runtime_db.sessions, registry, worker_id=f"w{n}", poll_interval=0.02)
            for n in range(4)
        ]
        deadline = time.monotonic() + DEADLINE_S
        async with running(workers):
            while await _count(runtime_db, jobs):
                assert time.monotonic() < deadline, "jobs left after the deadline"
                await asyncio.sleep(0.05)  # polling an observable condition
        assert recorder.overlaps == []
        assert recorder.order == {f"p{p}": list(range(per)) for p in range(partitions)}
    assert await _count(runtime_db, applied_jobs) == 3 * partitions * per
