# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Notify benchmark: renames on a file shared with 100 users, 100 open Subscribe streams.

    .venv/bin/python tests/benchmarks/bench_notify.py [--quick] [--dsn postgresql://...]
        [--interval-ms 20] [--sqlite]

A rename is ingested every `interval` ms (one file, audience of 100 users plus the actor;
the renames share a dedupe_key, so they fold into one digest per user that moves forward
in each stream). Measured: send -> delivery latency on the streams (p50/p99; the send
time is taken before the Ingest call, so it bounds commit -> delivery from above; it
includes Ingest, the fan-out job's queue hop and its transaction) and notifications
delivered per second. Baseline, measured in the same run: the job
runtime's bare lag (enqueue commit -> handler start, `bench_jobs.lag`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "gen"), str(REPO / "tests"), str(Path(__file__).parent)]

import grpc
import psycopg
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from sqlalchemy.engine import make_url
from support.services import running_app

from services.common.db import create_engine, session_factory
from services.common.logging import configure_logging
from services.common.migrate import upgrade
from services.common.runtime_migrations import migration_location
from services.notify.app import build_app
from services.notify.settings import NotifySettings

DEFAULT_DSN = "postgresql://postgres:serentak@127.0.0.1:5432/postgres"
USERS = [f"u{i:03d}" for i in range(100)]


def rename(version: int) -> events_pb2.Event:
    ev = events_pb2.Event(
        event_id=uuid.uuid4().hex,
        event_type="file.renamed",
        aggregate_type="file",
        aggregate_id="bench-file",
        tenant_id="acme",
        actor_user_id="owner",
        version=version,
        dedupe_key="file:bench-file:rename",
        audience_user_ids=[*USERS, "owner"],
        correlation_id=f"{time.perf_counter():.9f}",  # send time, read back on delivery
    )
    ev.occurred_at.GetCurrentTime()
    ev.file_renamed.CopyFrom(events_pb2.FileRenamed(file_id="bench-file", new_name=f"n{version}"))
    return ev


async def notify_run(url: str, data_dir: Path, renames: int, interval: float) -> tuple[list, float]:
    tokens = {f"tok-{u}": {"tenant_id": "acme", "user_id": u} for u in USERS}
    settings = NotifySettings(
        notify_database_url=url, data_dir=data_dir, auth_tokens=tokens, migrate_on_start=True
    )
    latencies: list[float] = []
    async with running_app(build_app(settings)) as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.app.bound_port}") as channel:
            stub = notify_pb2_grpc.NotifyServiceStub(channel)
            calls = [
                stub.Subscribe(
                    notify_pb2.SubscribeRequest(device_id="bench"),
                    metadata=(("authorization", f"Bearer tok-{u}"),),
                )
                for u in USERS
            ]
            for call in calls:  # the position marker: every stream is registered
                await call.read()

            async def drain(call) -> None:  # type: ignore[no-untyped-def]
                # Until the last version arrives: a stream that had to re-read from the
                # database sends a digest's latest state once, not every step of it.
                while True:
                    item = await call.read()
                    latencies.append(time.perf_counter() - float(item.notification.correlation_id))
                    if item.notification.version == renames:
                        return

            readers = [asyncio.create_task(drain(c)) for c in calls]
            md = (("authorization", "Bearer dev-service-upload"),)
            started = time.perf_counter()
            pending = []
            for v in range(1, renames + 1):
                ev = rename(v)
                pending.append(
                    asyncio.ensure_future(
                        stub.Ingest(notify_pb2.IngestRequest(event=ev), metadata=md)
                    )
                )
                await asyncio.sleep(interval)  # a steady producer rate, not synchronisation
            await asyncio.gather(*pending)
            await asyncio.wait_for(asyncio.gather(*readers), 120)
            elapsed = time.perf_counter() - started
            for call in calls:
                call.cancel()
    return latencies, len(latencies) / elapsed


async def job_lag(url: str, n: int) -> tuple[float, float]:
    import bench_jobs

    upgrade(url, [migration_location()])
    engine = create_engine(url)
    try:
        return await bench_jobs.lag(session_factory(engine), n, rate=100)
    finally:
        await engine.dispose()


def fresh_pg(dsn: str) -> tuple[str, str]:
    name = f"serentak_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(dsn).set(drivername="postgresql+psycopg", database=name)
    return name, url.render_as_string(hide_password=False)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dsn", default=os.environ.get("SERENTAK_TEST_PG_DSN", DEFAULT_DSN))
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--sqlite", action="store_true", help="notify on SQLite, not PostgreSQL")
    args = parser.parse_args()
    renames = 50 if args.quick else 300
    names: list[str] = []
    try:
        name, jobs_url = fresh_pg(args.dsn)
        names.append(name)
        base50, base99 = await job_lag(jobs_url, 100 if args.quick else 500)
        with tempfile.TemporaryDirectory() as tmp:
            if args.sqlite:
                url = f"sqlite+aiosqlite:///{tmp}/notify.db"
            else:
                name, url = fresh_pg(args.dsn)
                names.append(name)
            lat, rate = await notify_run(url, Path(tmp), renames, args.interval_ms / 1000)
        q = statistics.quantiles(lat, n=100)
        db = "SQLite" if args.sqlite else "PostgreSQL"
        print(
            f"notify: {renames} renames every {args.interval_ms:g} ms, 100 users, 100 streams, {db}"
        )
        print(
            f"baseline job runtime lag (commit -> handler): "
            f"p50 {base50 * 1000:.1f} ms, p99 {base99 * 1000:.1f} ms"
        )
        print(
            f"send -> stream delivery                     : p50 {q[49] * 1000:.1f} ms "
            f"({q[49] / base50:.2f}x baseline), p99 {q[98] * 1000:.1f} ms ({q[98] / base99:.2f}x)"
        )
        print(f"notifications delivered/s                   : {rate:8.0f}")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    configure_logging("bench", "console", "WARNING")
    asyncio.run(main())
