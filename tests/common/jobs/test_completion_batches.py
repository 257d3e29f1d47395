"""Jobs whose handlers wrote nothing are acknowledged many per statement, with the
single-job path's outcomes: completed, already applied, or lease lost (nothing changed)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select, text

from services.common.jobs import JobContext, JobRegistry, NewJob, Worker, enqueue
from services.common.jobs.completions import CompletionBatcher
from services.common.jobs.errors import LeaseLost
from services.common.jobs.models import applied_jobs, jobs
from services.common.jobs.queue import claim_jobs


async def _count(db, table) -> int:  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        return (await session.execute(select(func.count()).select_from(table))).scalar_one()


async def _claim(db, n: int, keys: list[str]):  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        for p, key in enumerate(keys):
            await enqueue(session, NewJob("t", {"p": p}, f"p{p}", key))
    async with db.sessions() as session, session.begin():
        return await claim_jobs(session, "w", ["t"], 30.0, limit=n)


async def test_one_batch_completes_records_and_reports_each_job(runtime_db) -> None:  # type: ignore[no-untyped-def]
    # Six jobs: two share a key, one lost its lease to a reclaim before the batch.
    claimed = await _claim(runtime_db, 6, ["k0", "k1", "k2", "dup", "dup", "k5"])
    lost = claimed[2]
    async with runtime_db.sessions() as session, session.begin():
        await session.execute(
            text("UPDATE jobs SET lease_token = 'someone-else' WHERE id = :id"), {"id": lost.id}
        )
    batcher = CompletionBatcher(runtime_db.sessions)
    outcomes = await asyncio.gather(
        *(batcher.complete(job, {"p": job.payload["p"]}) for job in claimed),
        return_exceptions=True,
    )
    assert batcher.batches < len(claimed)  # not a statement per job
    by_key = list(zip([j.idempotency_key for j in claimed], outcomes, strict=True))
    assert by_key[0] == ("k0", True) and by_key[1] == ("k1", True) and by_key[5] == ("k5", True)
    assert isinstance(by_key[2][1], LeaseLost)
    assert sorted(o for k, o in by_key if k == "dup") == [False, True]  # recorded once
    async with runtime_db.sessions() as session, session.begin():
        left = (await session.execute(select(jobs.c.id))).scalars().all()
        rows = await session.execute(select(applied_jobs.c.idempotency_key, applied_jobs.c.effect))
        recorded = {key: effect for key, effect in rows}
    assert left == [lost.id]  # the reclaimed job is untouched, for its new owner
    assert recorded == {"k0": {"p": 0}, "k1": {"p": 1}, "dup": {"p": 3}, "k5": {"p": 5}}


@pytest.mark.parametrize("writes", [False, True])
async def test_worker_acknowledges_each_job_once_whether_or_not_the_handler_wrote(
    runtime_db, writes: bool
) -> None:  # type: ignore[no-untyped-def]
    async with runtime_db.sessions() as session, session.begin():
        await session.execute(text("CREATE TABLE effects (k VARCHAR(64) PRIMARY KEY)"))

    async def handler(ctx: JobContext) -> None:
        if writes:
            await ctx.session.execute(
                text("INSERT INTO effects (k) VALUES (:k)"), {"k": ctx.idempotency_key}
            )

    registry = JobRegistry()
    registry.register("t", handler)
    worker = Worker(runtime_db.sessions, registry, worker_id="w", poll_interval=0.05)
    claimed = await _claim(runtime_db, 8, [f"k{i}" for i in range(8)])
    await asyncio.gather(*(worker.execute(job) for job in claimed))
    assert await _count(runtime_db, jobs) == 0
    assert await _count(runtime_db, applied_jobs) == 8
    async with runtime_db.sessions() as session, session.begin():
        effects = (await session.execute(text("SELECT count(*) FROM effects"))).scalar_one()
    assert effects == (8 if writes else 0)
    # Replayed (the same keys again): acknowledged, never applied twice.
    again = await _claim(runtime_db, 8, [f"k{i}" for i in range(8)])
    assert all(job.already_applied for job in again)
    await asyncio.gather(*(worker.execute(job) for job in again))
    assert await _count(runtime_db, jobs) == 0
    assert await _count(runtime_db, applied_jobs) == 8
