"""Retry policy: the backoff formula's bounds, Retry-After floors, and real spacing."""

from __future__ import annotations

import asyncio
import itertools
import random
import time

from services.common.jobs import (
    JobContext,
    JobRegistry,
    NewJob,
    RetryPolicy,
    TransientError,
    Worker,
    enqueue,
)
from services.common.jobs.errors import RetryLater


def test_delay_stays_within_full_jitter_bounds() -> None:
    policy = RetryPolicy(max_attempts=10, base_seconds=0.5, cap_seconds=10)
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(10, 0.5 * 2 ** (attempt - 1))
        delays = [policy.delay(attempt, rng=rng) for _ in range(500)]
        assert all(0 <= d <= ceiling for d in delays)
        # Full jitter: spread over the whole range, not bunched at the top.
        assert min(delays) < ceiling * 0.1 and max(delays) > ceiling * 0.9


def test_retry_after_is_a_floor_capped_by_the_policy() -> None:
    policy = RetryPolicy(base_seconds=0.01, cap_seconds=60)
    assert all(policy.delay(1, retry_after=5.0) >= 5.0 for _ in range(100))
    assert policy.delay(1, retry_after=10_000) <= 60
    assert policy.gives_up_after(policy.max_attempts) and not policy.gives_up_after(1)


async def test_attempts_are_spaced_within_the_jitter_bounds(runtime_db) -> None:  # type: ignore[no-untyped-def]
    base, attempts = 0.2, 4
    started: list[float] = []
    done = asyncio.Event()

    async def flaky(ctx: JobContext) -> None:
        started.append(time.monotonic())
        if ctx.attempt == attempts:
            done.set()
        if ctx.attempt < attempts:
            raise TransientError("try again")

    registry = JobRegistry()
    registry.register("flaky", flaky, retry=RetryPolicy(max_attempts=attempts, base_seconds=base))
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("flaky", {}, "a", "k"))
    worker = Worker(runtime_db.sessions, registry, worker_id="w", poll_interval=0.01)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), 30)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(started) == attempts
    slack = 0.5  # poll interval + claim and commit time on a loaded 2-core machine
    for n, (a, b) in enumerate(itertools.pairwise(started), start=1):
        assert 0 <= b - a <= base * 2 ** (n - 1) + slack, (n, b - a)


async def test_retry_after_hint_is_honoured(runtime_db) -> None:  # type: ignore[no-untyped-def]
    started: list[float] = []
    done = asyncio.Event()

    async def throttled(ctx: JobContext) -> None:
        started.append(time.monotonic())
        if ctx.attempt == 2:
            done.set()
        if ctx.attempt == 1:
            raise RetryLater("429", retry_after=0.6)

    registry = JobRegistry()
    registry.register("t", throttled, retry=RetryPolicy(base_seconds=0.001))
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "a", "k"))
    worker = Worker(runtime_db.sessions, registry, worker_id="w", poll_interval=0.01)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), 30)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(started) == 2 and started[1] - started[0] >= 0.6
