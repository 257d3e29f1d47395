"""A worker process for the multi-process tests: `python worker_proc.py URL WORKER_ID ...`.

Its handler appends one row per execution to `job_effects` (no unique constraint, so a
second effect would be visible) after checking that the previous job of the same key
has been applied (per-key order). With --hang-marker, the first attempt of a job whose
payload has "hang" writes the marker file and then never finishes (the test kills us).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select

from services.common.db import create_engine, session_factory
from services.common.jobs import JobContext, JobRegistry, PermanentError, RetryPolicy, Worker

effects_metadata = MetaData()
job_effects = Table(
    "job_effects",
    effects_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(255), nullable=False),
    Column("partition_key", String(255), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", String(255), nullable=False),
)

JOB_TYPE = "record_effect"


def make_registry(hang_marker: Path | None = None) -> JobRegistry:
    """The registry of the test workers: one job type that records its effect."""

    async def record_effect(ctx: JobContext) -> None:
        key, seq = ctx.payload["key"], int(ctx.payload["seq"])
        if hang_marker is not None and ctx.payload.get("hang") and ctx.attempt == 1:
            hang_marker.write_text(ctx.worker_id)  # noqa: ASYNC240 - tiny marker file
            await asyncio.Event().wait()  # killed here
        previous = (
            await ctx.session.execute(
                select(func.max(job_effects.c.seq)).where(job_effects.c.partition_key == key)
            )
        ).scalar()
        if (previous if previous is not None else -1) != seq - 1:
            raise PermanentError(f"order broken on {key}: seq {seq} after {previous}")
        await ctx.session.execute(
            insert(job_effects).values(
                idempotency_key=ctx.idempotency_key,
                partition_key=key,
                seq=seq,
                attempt=ctx.attempt,
                worker_id=ctx.worker_id,
            )
        )

    registry = JobRegistry()
    registry.register(JOB_TYPE, record_effect, retry=RetryPolicy(max_attempts=5, base_seconds=0.05))
    return registry


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("worker_id")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--hang-marker", type=Path, default=None)
    args = parser.parse_args()
    engine = create_engine(args.url, sqlite_synchronous="NORMAL")
    worker = Worker(
        session_factory(engine),
        make_registry(args.hang_marker),
        worker_id=args.worker_id,
        lease_seconds=args.lease,
        poll_interval=0.05,
        concurrency=args.concurrency,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
