# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Job claims behind a deep partition: does one busy partition slow every claim?

    .venv/bin/python tests/benchmarks/bench_job_claims.py [--quick] [--depth N]
        [--dsn postgresql://...]

A partition runs one job at a time, so a partition whose head is running (a file under a
burst of edits, a chain of notify events after an outage) has everything behind it
waiting. The queue holds `SHALLOW` partitions of one job each (what a claim should find)
and, in the "deep" queue only, one more partition of `--depth` jobs whose head is leased
to another worker. One claim of up to 4 jobs (the worker's batch) then gives its jobs
back (`queue.release`), so every claim sees the same queue; each claim is one
transaction, timed from BEGIN to COMMIT. PostgreSQL's queues are ANALYZEd after the fill,
as autovacuum would within its first minute.

Baseline, measured in the same run on the same database engine: the same claims on the
"shallow" queue, the same partitions without the deep one. Claims alternate between the
two queues (each in its own database), so load swings hit both alike. Prints each one's
p50/p99 per claim and deep/shallow; SQLite (a temporary file) and PostgreSQL (`--dsn`,
a fresh database each).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.postgres import PostgresDatabases

from services.common.db import create_engine, session_factory
from services.common.jobs import NewJob, enqueue
from services.common.jobs.queue import claim_jobs, release
from services.common.logging import configure_logging
from services.common.migrate import upgrade
from services.common.runtime_migrations import migration_location

DEFAULT_DSN = "postgresql://postgres:serentak@127.0.0.1:5432/postgres"
SHALLOW = 64  # one-job partitions: what every claim finds
BATCH = 4  # jobs a claim asks for (a worker's batch at concurrency 4..8)
FILL_BATCH = 2000  # jobs per enqueue transaction while filling


async def fill(sessions: async_sessionmaker[AsyncSession], depth: int) -> None:
    """The deep partition (its head leased elsewhere), then the one-job partitions."""
    if depth:
        async with sessions() as session, session.begin():
            await enqueue(session, NewJob("t", {}, "hot", "hot-0"))
        async with sessions() as session, session.begin():
            held = await claim_jobs(session, "elsewhere", ["t"], 3600, limit=1)
            assert [j.partition_key for j in held] == ["hot"]
        for first in range(1, depth, FILL_BATCH):
            async with sessions() as session, session.begin():
                for i in range(first, min(first + FILL_BATCH, depth)):
                    await enqueue(session, NewJob("t", {}, "hot", f"hot-{i}"))
    async with sessions() as session, session.begin():
        for p in range(SHALLOW):
            await enqueue(session, NewJob("t", {}, f"p{p}", f"p{p}"))
    async with sessions() as session, session.begin():
        if session.get_bind().dialect.name == "postgresql":
            # What autovacuum does within a minute of such a fill: plan on statistics.
            await session.execute(text("ANALYZE jobs"))


async def claim_and_give_back(sessions: async_sessionmaker[AsyncSession]) -> float:
    """One claim transaction's seconds; its jobs are then handed back untouched."""
    began = time.perf_counter()
    async with sessions() as session, session.begin():
        claimed = await claim_jobs(session, "bench", ["t"], 30, limit=BATCH)
    took = time.perf_counter() - began
    assert len(claimed) == BATCH and all(j.partition_key != "hot" for j in claimed)
    async with sessions() as session, session.begin():
        for job in claimed:
            assert await release(session, job)
    return took


async def compare(label: str, urls: dict[str, str], depth: int, claims: int) -> float:
    """deep/shallow p50 on one engine (one database per queue)."""
    engines = {name: create_engine(url) for name, url in urls.items()}
    try:
        makers = {name: session_factory(engine) for name, engine in engines.items()}
        began = time.perf_counter()
        for name, sessions in makers.items():
            await fill(sessions, depth if name == "deep" else 0)
        print(f"{label}: filled in {time.perf_counter() - began:.1f} s")
        for sessions in makers.values():  # warm-up: caches, plans, connections
            for _ in range(5):
                await claim_and_give_back(sessions)
        times: dict[str, list[float]] = {name: [] for name in makers}
        for i in range(claims):
            order = list(makers) if i % 2 else list(reversed(makers))
            for name in order:
                times[name].append(await claim_and_give_back(makers[name]))
        p50 = {}
        for name, samples in times.items():
            q = statistics.quantiles(samples, n=100)
            p50[name] = q[49]
            print(
                f"{label} {name:<8} one claim of {BATCH}: p50 {q[49] * 1000:8.2f} ms,"
                f" p99 {q[98] * 1000:8.2f} ms"
            )
        ratio = p50["deep"] / p50["shallow"]
        print(f"{label}: a {depth:,}-deep partition behind a running head: claim p50 x{ratio:.2f}")
        return ratio
    finally:
        for engine in engines.values():
            await engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 deep, 40 claims")
    parser.add_argument("--depth", type=int, default=None, help="jobs in the deep partition")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL admin DSN")
    args = parser.parse_args()
    configure_logging("bench")
    depth = args.depth or (5_000 if args.quick else 20_000)
    claims = 40 if args.quick else 200
    print(f"job claims: {SHALLOW} one-job partitions, claims of {BATCH}, {claims} per queue")
    with tempfile.TemporaryDirectory() as tmp:
        urls = {q: f"sqlite+aiosqlite:///{tmp}/{q}.db" for q in ("deep", "shallow")}
        for url in urls.values():
            upgrade(url, [migration_location()])
        await compare("sqlite", urls, depth, claims)
    databases = PostgresDatabases(args.dsn)
    try:
        urls = {q: databases.create() for q in ("deep", "shallow")}
        for url in urls.values():
            upgrade(url, [migration_location()])
        await compare("postgresql", urls, depth, claims)
    finally:
        databases.drop_all()


if __name__ == "__main__":
    asyncio.run(main())
