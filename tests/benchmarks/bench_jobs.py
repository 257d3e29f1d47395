# ruff: noqa: ASYNC110, ASYNC220 - a benchmark polls the database and spawns its workers
"""Job queue benchmark on PostgreSQL: jobs/s with 1 and 2 worker processes, and lag.

    .venv/bin/python tests/benchmarks/bench_jobs.py [--quick] [--dsn postgresql://...]

Baseline, measured in the same run right before each throughput run: the same number of
bare INSERT+DELETE round trips (one transaction each). Throughput is timed from the
commit of the jobs to the queue being empty, with the worker processes already started
and idle (process start-up is not job work). Workers run with the runtime's defaults:
concurrency 4, poll 0.5 s, woken by PostgreSQL NOTIFY. Lag: enqueue -> handler start,
p50/p99, with a producer enqueueing at a steady rate from another connection while one
in-process worker runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO)]

import psycopg  # noqa: E402
from sqlalchemy import func, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from services.common.db import create_engine, session_factory  # noqa: E402
from services.common.jobs import JobContext, JobRegistry, NewJob, Worker, enqueue  # noqa: E402
from services.common.jobs.listener import JOBS_CHANNEL, CommitListener  # noqa: E402
from services.common.jobs.models import jobs, utcnow  # noqa: E402
from services.common.logging import configure_logging  # noqa: E402
from services.common.migrate import upgrade  # noqa: E402
from services.common.runtime_migrations import migration_location  # noqa: E402

DEFAULT_DSN = "postgresql://postgres:serentak@127.0.0.1:5432/postgres"


def registry(lags: list[float] | None = None) -> JobRegistry:
    async def noop(ctx: JobContext) -> None:
        if lags is not None:
            lags.append((utcnow() - ctx.job.enqueued_at).total_seconds())

    reg = JobRegistry()
    reg.register("noop", noop)
    return reg


POLL_S = 0.5  # the runtime's default; NOTIFY does the waking


def listening_worker(sessions, reg: JobRegistry, worker_id: str):  # type: ignore[no-untyped-def]
    worker = Worker(sessions, reg, worker_id=worker_id, poll_interval=POLL_S, concurrency=4)
    engine = sessions.kw["bind"]
    return worker, CommitListener(engine.url, {JOBS_CHANNEL: worker.wake})


async def worker_main(url: str, worker_id: str) -> None:
    engine = create_engine(url)
    worker, listener = listening_worker(session_factory(engine), registry(), worker_id)
    tasks = [asyncio.create_task(listener.run()), asyncio.create_task(worker.run())]
    await listener.listening.wait()
    await worker.idling.wait()
    print("ready", flush=True)
    await asyncio.gather(*tasks)


async def fill(sessions, n: int, keys: int) -> None:  # type: ignore[no-untyped-def]
    async with sessions() as session, session.begin():
        for i in range(n):
            await enqueue(session, NewJob("noop", {"i": i}, f"k{i % keys}", uuid.uuid4().hex))


async def remaining(sessions) -> int:  # type: ignore[no-untyped-def]
    async with sessions() as session, session.begin():
        return (await session.execute(select(func.count()).select_from(jobs))).scalar_one()


async def throughput(url: str, sessions, n: int, processes: int) -> float:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", url, f"b{i}"],
            env=env,
            stderr=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        for i in range(processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = await asyncio.to_thread(p.stdout.readline)
            assert line.strip() == b"ready", "worker process failed to start"
        await fill(sessions, n, keys=200)
        started = time.perf_counter()
        while await remaining(sessions):
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    return n / elapsed


async def baseline(sessions, n: int) -> float:  # type: ignore[no-untyped-def]
    async with sessions() as session, session.begin():
        await session.execute(
            text("CREATE TABLE IF NOT EXISTS bench_rt (id serial PRIMARY KEY, v text)")
        )
    started = time.perf_counter()
    for _ in range(n):
        async with sessions() as session, session.begin():
            rid = (
                await session.execute(text("INSERT INTO bench_rt (v) VALUES ('x') RETURNING id"))
            ).scalar_one()
        async with sessions() as session, session.begin():
            await session.execute(text("DELETE FROM bench_rt WHERE id = :id"), {"id": rid})
    return n / (time.perf_counter() - started)


async def lag(sessions, n: int, rate: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    lags: list[float] = []
    worker, listener = listening_worker(sessions, registry(lags), "lag")
    tasks = [asyncio.create_task(listener.run()), asyncio.create_task(worker.run())]
    await listener.listening.wait()
    for i in range(n):
        async with sessions() as session, session.begin():
            await enqueue(session, NewJob("noop", {"i": i}, f"k{i % 50}", uuid.uuid4().hex))
        await asyncio.sleep(1 / rate)  # a steady producer rate, not synchronisation
    while len(lags) < n:
        await asyncio.sleep(0.05)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    q = statistics.quantiles(lags, n=100)
    return q[49], q[98]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dsn", default=os.environ.get("SERENTAK_TEST_PG_DSN", DEFAULT_DSN))
    args = parser.parse_args()
    n = 500 if args.quick else 3000
    name = f"serentak_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(args.dsn).set(drivername="postgresql+psycopg", database=name)
    url_s = url.render_as_string(hide_password=False)
    try:
        upgrade(url_s, [migration_location()])
        engine = create_engine(url_s)
        sessions = session_factory(engine)
        # The machine is shared: each run is compared with a baseline taken right before
        # it, so a load swing between runs does not land in one side of a ratio only.
        base = await baseline(sessions, n)
        one = await throughput(url_s, sessions, n, 1)
        base2 = await baseline(sessions, n)
        two = await throughput(url_s, sessions, n, 2)
        p50, p99 = await lag(sessions, n // 5, rate=100)
        await engine.dispose()
        print(f"jobs: {n}, no-op handler, PostgreSQL, 200 partition keys")
        print(f"baseline INSERT+DELETE round trips/s : {base:8.0f}")
        print(f"jobs/s, 1 worker process             : {one:8.0f}  ({one / base:.2f}x baseline)")
        print(f"baseline again, before 2 processes    : {base2:8.0f}")
        print(f"jobs/s, 2 worker processes           : {two:8.0f}  ({two / base2:.2f}x baseline)")
        print(
            f"lag enqueue -> handler start (poll {POLL_S} s, NOTIFY): "
            f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
        )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    configure_logging("bench", "console", "WARNING")
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        asyncio.run(worker_main(sys.argv[2], sys.argv[3]))
    else:
        asyncio.run(main())
