"""The queue on its own: transactional enqueue, claim order, leases, dedupe, idempotency."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import func, select

from services.common.jobs import JobContext, JobRegistry, NewJob, Worker, enqueue
from services.common.jobs.models import applied_jobs, jobs, utcnow
from services.common.jobs.queue import claim_next_job, complete


async def _count(db, table) -> int:  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        return (await session.execute(select(func.count()).select_from(table))).scalar_one()


async def _claim(db, worker: str = "w", lease: float = 30.0):  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        return await claim_next_job(session, worker, ["t"], lease)


async def test_rolled_back_enqueue_leaves_no_job_and_commit_leaves_one(runtime_db) -> None:  # type: ignore[no-untyped-def]
    async with runtime_db.sessions() as session:
        async with session.begin():
            await enqueue(session, NewJob("t", {"n": 1}, "p", "k1"))
            await session.rollback()
    assert await _count(runtime_db, jobs) == 0
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {"n": 1}, "p", "k1"))
    assert await _count(runtime_db, jobs) == 1


async def test_partition_runs_one_job_at_a_time_in_enqueue_order(runtime_db) -> None:  # type: ignore[no-untyped-def]
    async with runtime_db.sessions() as session, session.begin():
        for i in range(3):
            await enqueue(session, NewJob("t", {"i": i}, "a", f"a{i}"))
        await enqueue(session, NewJob("t", {"i": 0}, "b", "b0"))
    first = await _claim(runtime_db)
    second = await _claim(runtime_db)
    assert (first.partition_key, first.payload) == ("a", {"i": 0})
    assert (second.partition_key, second.payload) == ("b", {"i": 0})
    assert await _claim(runtime_db) is None  # a1 waits behind a0, b is done
    async with runtime_db.sessions() as session, session.begin():
        await complete(session, first)
    nxt = await _claim(runtime_db)
    assert (nxt.partition_key, nxt.payload) == ("a", {"i": 1})


async def test_job_waiting_for_retry_blocks_its_partition(runtime_db) -> None:  # type: ignore[no-untyped-def]
    later = utcnow() + timedelta(hours=1)
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "a", "a0", run_after=later))
        await enqueue(session, NewJob("t", {}, "a", "a1"))
    assert await _claim(runtime_db) is None


async def test_expired_lease_is_reclaimed_and_old_holder_cannot_complete(runtime_db) -> None:  # type: ignore[no-untyped-def]
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "a", "a0"))
    stale = await _claim(runtime_db, "old", lease=0.0)
    fresh = await _claim(runtime_db, "new")
    assert fresh is not None and fresh.job_id == stale.job_id and fresh.attempts == 2
    async with runtime_db.sessions() as session:
        try:
            async with session.begin():
                await complete(session, stale)
            raise AssertionError("a stale lease completed the job")
        except Exception as exc:  # LeaseLost
            assert type(exc).__name__ == "LeaseLost"
    assert await _count(runtime_db, jobs) == 1


async def test_concurrent_claimers_never_share_a_job_or_a_partition(runtime_db) -> None:  # type: ignore[no-untyped-def]
    partitions, per = 10, 6
    async with runtime_db.sessions() as session, session.begin():
        for i in range(per):
            for p in range(partitions):
                await enqueue(session, NewJob("t", {"i": i}, f"p{p}", f"p{p}:{i}"))
    active: set[str] = set()
    order: dict[str, list[int]] = {}

    async def claimer(name: str) -> None:
        idle = 0
        while idle < 3:
            job = await _claim(runtime_db, name)
            if job is None:
                idle += 1
                await asyncio.sleep(0.01)  # yield so others can finish; not synchronisation
                continue
            idle = 0
            assert job.partition_key not in active, "two jobs of one partition at once"
            active.add(job.partition_key)
            order.setdefault(job.partition_key, []).append(job.payload["i"])
            await asyncio.sleep(0)
            active.discard(job.partition_key)
            async with runtime_db.sessions() as session, session.begin():
                await complete(session, job)

    for _round in range(3):
        await asyncio.gather(*(claimer(f"c{i}") for i in range(8)))
        if await _count(runtime_db, jobs) == 0:
            break
    assert await _count(runtime_db, jobs) == 0
    assert all(v == list(range(per)) for v in order.values()) and len(order) == partitions


async def test_dedupe_window_collapses_into_one_run_with_latest_payload(runtime_db) -> None:  # type: ignore[no-untyped-def]
    runs: list[dict] = []

    async def handler(ctx: JobContext) -> None:
        runs.append(ctx.payload)

    registry = JobRegistry()
    registry.register("notify", handler, dedupe_window_seconds=0.3)
    async with runtime_db.sessions() as session, session.begin():
        ids = [
            await enqueue(
                session,
                registry.new_job(
                    "notify",
                    {"v": v},
                    partition_key="u1",
                    idempotency_key=f"n{v}",
                    dedupe_key="u1:f1",
                ),
            )
            for v in range(1, 4)
        ]
        other = await enqueue(
            session,
            registry.new_job(
                "notify", {"v": 9}, partition_key="u2", idempotency_key="x", dedupe_key="u2:f1"
            ),
        )
    assert len(set(ids)) == 1 and other != ids[0]
    worker = Worker(runtime_db.sessions, registry, worker_id="w")
    assert not await worker.run_once()  # the window is still open
    deadline = asyncio.get_running_loop().time() + 10
    while await _count(runtime_db, jobs) and asyncio.get_running_loop().time() < deadline:
        if not await worker.run_once():
            await asyncio.sleep(0.05)
    assert sorted(r["v"] for r in runs) == [3, 9]
    # After the window's job started, the same dedupe_key opens a new window.
    async with runtime_db.sessions() as session, session.begin():
        again = await enqueue(
            session,
            registry.new_job(
                "notify", {"v": 4}, partition_key="u1", idempotency_key="n4", dedupe_key="u1:f1"
            ),
        )
    assert again != ids[0]


async def test_job_with_applied_idempotency_key_is_acknowledged_without_effect(runtime_db) -> None:  # type: ignore[no-untyped-def]
    runs: list[str] = []

    async def handler(ctx: JobContext) -> None:
        runs.append(ctx.idempotency_key)
        ctx.effect = {"done": ctx.idempotency_key}

    registry = JobRegistry()
    registry.register("t", handler)
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "a", "same-key"))
        await enqueue(session, NewJob("t", {}, "b", "same-key"))
    worker = Worker(runtime_db.sessions, registry, worker_id="w")
    assert await worker.run_once() and await worker.run_once()
    assert runs == ["same-key"]
    assert await _count(runtime_db, jobs) == 0
    async with runtime_db.sessions() as session, session.begin():
        effect = (await session.execute(select(applied_jobs.c.effect))).scalar_one()
    assert effect == {"done": "same-key"}


async def test_handler_effects_roll_back_when_the_lease_was_lost(runtime_db) -> None:  # type: ignore[no-untyped-def]
    ran: list[str] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.worker_id)
        ctx.effect = {"by": ctx.worker_id}

    registry = JobRegistry()
    registry.register("t", handler)
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "a", "k"))
    stale = await _claim(runtime_db, "old", lease=0.0)
    fresh = await _claim(runtime_db, "new")  # the lease ended: reclaimed
    await Worker(runtime_db.sessions, registry, worker_id="old").execute(stale)
    assert ran == ["old"]
    assert await _count(runtime_db, applied_jobs) == 0  # its transaction rolled back
    await Worker(runtime_db.sessions, registry, worker_id="new").execute(fresh)
    async with runtime_db.sessions() as session, session.begin():
        effect = (await session.execute(select(applied_jobs.c.effect))).scalar_one()
    assert effect == {"by": "new"} and ran == ["old", "new"]
    assert await _count(runtime_db, jobs) == 0
