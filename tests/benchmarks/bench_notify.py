# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Notify benchmark: content updates of one file shared with N users, open Subscribe streams.

    .venv/bin/python tests/benchmarks/bench_notify.py [--quick] [--dsn postgresql://...]
        [--sqlite] [--audience 100 --audience 1000] [--streams 100]
        [--max-batch 1 --max-batch 64] [--streams-on-replica]

The notify service runs in this process; its clients (the producer calling Ingest and the
Subscribe streams) run in a separate process (`--client`), so the numbers are the
service's, not the benchmark's own. Every content update must become one notification per
collaborator (content changes never fold), so a run of E events to an audience of N
writes exactly E x N notifications.

Per audience, two runs on a fresh database:
- throughput: events as fast as the relay's way of sending allows (one IngestBatch in
  flight with whatever is pending, at most 100 events, as the upload outbox relay does);
  notifications/s = E x N / (first send -> last version delivered on every open stream);
- latency at half the 10,000 notifications/s target (5,000/N events/s, paced), p50/p99
  of two spans per delivered notification: commit -> delivery (the target's; the commit
  is stamped in the service process by the first `after_commit` listener of the
  transaction that wrote the notification, the delivery when the client's read returns,
  both on CLOCK_MONOTONIC, which `time.perf_counter` reads in every process of the
  machine), and send -> delivery (from before the producer's Ingest call: it adds the
  relay's queue and Ingest's own time).
Each run is made once per `--max-batch` (default 1 and 64): the streams' SubscribeRequest
max_batch, one notification per message (1) or up to that many already waiting in one.
Baseline, measured in the same run: the job runtime's bare lag, enqueue commit -> handler
start (the producer stamps each job when its COMMIT returns, the no-op handler when it
starts), 100 jobs/s right before and right after each latency run, pooled (100 + 100
samples with --quick, 500 + 500 without). For context, each run is followed by the same
run against a bare grpc.aio server (`notify_floor.py`: the same stream items handed from
IngestBatch to the streams, no database): its notifications/s and receipt -> delivery
are the ceiling that gRPC, Python and the client set on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]

import grpc
import psycopg
from notify_floor import serve
from notify_replica import replica_process, replica_settings
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.sdk import notifications_in
from sqlalchemy import event as sa_event
from sqlalchemy.engine import make_url
from support.services import running_app

from services.common.db import create_engine, session_factory
from services.common.jobs import JobContext, JobRegistry
from services.common.logging import configure_logging
from services.common.migrate import upgrade
from services.common.runtime_migrations import migration_location
from services.notify.app import build_app
from services.notify.database import prepare
from services.notify.fanout_writer import FanOutWriter

DEFAULT_DSN = "postgresql://postgres:serentak@127.0.0.1:5432/postgres"
TARGET_RATE = 10_000  # notifications/s
RELAY_BATCH = 100  # the relay's default batch_size
FLOOR = "floor, bare grpc.aio server (same stream items, no database)"
DURABLE_FLOOR = "durable floor, the same storing each batch in PostgreSQL"


def users(audience: int) -> list[str]:
    return [f"u{i:04d}" for i in range(audience)]


def content_update(version: int, audience: list[str]) -> events_pb2.Event:
    ev = events_pb2.Event(
        event_id=uuid.uuid4().hex,
        event_type="file.content_updated",
        aggregate_type="file",
        aggregate_id="bench-file",
        tenant_id="acme",
        actor_user_id="owner",
        version=version,
        audience_user_ids=[*audience, "owner"],
        correlation_id=f"{time.perf_counter():.9f}",  # send time, read back on delivery
    )
    ev.occurred_at.GetCurrentTime()
    ev.file_content_updated.CopyFrom(
        events_pb2.FileContentUpdated(file_id="bench-file", name="report.txt", size=version)
    )
    return ev


# --- the client process ---------------------------------------------------------------


async def client(
    port: int,
    stream_port: int,
    audience: int,
    streams: int,
    events: int,
    rate: float,
    max_batch: int,
) -> dict:
    """Open `streams` streams (on the service at `stream_port`), send `events` content
    updates (paced at `rate` events/s, or as fast as the relay-like sender takes them when
    0) to the one at `port`, wait until every stream has the last version."""
    audience_ids = users(audience)
    latencies: list[float] = []
    received_at: list[tuple[int, float]] = []  # (version, when the read returned)
    done_at: list[float] = []
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        grpc.aio.insecure_channel(f"127.0.0.1:{stream_port}") as stream_channel,
    ):
        stub = notify_pb2_grpc.NotifyServiceStub(channel)
        stream_stub = notify_pb2_grpc.NotifyServiceStub(stream_channel)
        calls = [
            stream_stub.Subscribe(
                notify_pb2.SubscribeRequest(device_id="bench", max_batch=max_batch),
                metadata=(("authorization", f"Bearer tok-{u}"),),
            )
            for u in audience_ids[:streams]
        ]
        for call in calls:  # the position marker: every stream is registered
            await call.read()

        async def drain(call) -> None:  # type: ignore[no-untyped-def]
            last = 0
            while last < events:
                item = await call.read()
                received = time.perf_counter()
                for n in notifications_in(item):
                    latencies.append(received - float(n.correlation_id))
                    if rate:
                        received_at.append((n.version, received))
                    last = n.version
            done_at.append(time.perf_counter())

        readers = [asyncio.create_task(drain(c)) for c in calls]
        md = (("authorization", "Bearer dev-service-upload"),)
        # As the upload service's outbox relay sends one file's events: one IngestBatch
        # in flight, carrying whatever is pending (at most RELAY_BATCH events).
        pending: list[events_pb2.Event] = []
        produced = asyncio.Event()
        taken = asyncio.Event()
        started = time.perf_counter()

        async def relay() -> None:
            sent = 0
            while sent < events:
                while not pending:
                    produced.clear()
                    await produced.wait()
                batch = pending[:RELAY_BATCH]
                del pending[:RELAY_BATCH]
                taken.set()
                await stub.IngestBatch(notify_pb2.IngestBatchRequest(events=batch), metadata=md)
                sent += len(batch)

        sender = asyncio.create_task(relay())
        for v in range(1, events + 1):
            if rate:
                delay = started + (v - 1) / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)  # a steady producer rate, not synchronisation
            while len(pending) >= RELAY_BATCH:  # the relay reads its outbox in batches too
                taken.clear()
                await taken.wait()
            pending.append(content_update(v, audience_ids))
            produced.set()
        await sender
        sent = time.perf_counter() - started
        async with asyncio.timeout(300):
            await asyncio.gather(*readers)
        elapsed = max(done_at) - started
        for call in calls:
            call.cancel()
    q = statistics.quantiles(latencies, n=100)
    return {
        "rate": events * audience / elapsed,
        "sent_per_s": events / sent,
        "p50": q[49],
        "p99": q[98],
        "delivered": len(latencies),
        "received_at": received_at,
    }


# --- the service process --------------------------------------------------------------


async def run_client(
    port: int,
    audience: int,
    streams: int,
    events: int,
    rate: float,
    max_batch: int,
    stream_port: int | None = None,
) -> dict:
    args = [str(port), str(stream_port or port), str(audience), str(streams), str(events)]
    args += [str(rate), str(max_batch)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"client failed ({proc.returncode})")
    return json.loads(out.decode().strip().splitlines()[-1])


# Event version -> when the transaction that wrote its notifications committed (this,
# the service's, process; filled by `stamp_commits`).
COMMITTED: dict[int, float] = {}


def stamp_commits() -> None:
    """Stamp each fanned-out event's commit in `COMMITTED`: a listener registered ahead
    of the writer's own (which publishes to streams), so it runs first after COMMIT."""
    publish = FanOutWriter.publish_after_commit

    def stamped(self, session, fanned, chain, *, inline=False):  # type: ignore[no-untyped-def]
        def committed(_session: object) -> None:
            now = time.perf_counter()
            for ev in chain:
                COMMITTED.setdefault(ev.version, now)

        sa_event.listen(session.sync_session, "after_commit", committed, once=True)
        publish(self, session, fanned, chain, inline=inline)

    FanOutWriter.publish_after_commit = stamped  # type: ignore[method-assign]


async def notify_run(
    url: str,
    data_dir: Path,
    audience: int,
    streams: int,
    events: int,
    rate: float,
    max_batch: int,
    streams_on_replica: bool = False,
) -> dict:
    settings = replica_settings(url, data_dir, users(audience))
    COMMITTED.clear()
    async with running_app(build_app(settings)) as service:
        port = service.app.bound_port
        if streams_on_replica:
            async with replica_process(url, audience) as stream_port:
                r = await run_client(port, audience, streams, events, rate, max_batch, stream_port)
        else:
            r = await run_client(port, audience, streams, events, rate, max_batch)
    r["commit_to_delivery"] = [t - COMMITTED[v] for v, t in r.pop("received_at")]
    return r


async def floor_run(
    audience: int,
    streams: int,
    events: int,
    rate: float,
    max_batch: int,
    durable_url: str | None = None,
) -> dict:
    """The same run against the bare server (durable: storing in the PostgreSQL database
    at `durable_url`, notify's schema made here): the client's result, with receipt ->
    delivery of every notification (paced runs) in `receipt_to_delivery`."""
    async with contextlib.AsyncExitStack() as stack:
        connection = None
        if durable_url is not None:
            prepare(durable_url, migrate_on_start=True)
            dsn = make_url(durable_url).set(drivername="postgresql")
            connection = await stack.enter_async_context(
                await psycopg.AsyncConnection.connect(dsn.render_as_string(hide_password=False))
            )
        server, servicer, port = await serve(connection)
        try:
            r = await run_client(port, audience, streams, events, rate, max_batch)
        finally:
            await server.stop(None)
    r["receipt_to_delivery"] = [t - servicer.received[v] for v, t in r.pop("received_at")]
    return r


async def job_lag(url: str, n: int) -> list[float]:
    """`n` samples of the job runtime's bare lag, enqueue commit -> handler start, at
    100 jobs/s (the producer stamps each job once its COMMIT returned)."""
    import bench_jobs

    upgrade(url, [migration_location()])
    engine = create_engine(url)
    sessions = session_factory(engine)
    # Both stamped, subtracted at the end: the NOTIFY can wake the worker before the
    # producer's coroutine resumes after its COMMIT.
    committed: dict[int, float] = {}
    started: dict[int, float] = {}

    async def noop(ctx: JobContext) -> None:
        started.setdefault(ctx.payload["i"], time.perf_counter())

    registry = JobRegistry()
    registry.register("noop", noop)
    worker, listener = bench_jobs.listening_worker(sessions, registry, "lag")
    tasks = [asyncio.create_task(listener.run()), asyncio.create_task(worker.run())]
    try:
        await listener.listening.wait()
        for i in range(n):
            async with sessions() as session, session.begin():
                await bench_jobs.enqueue(
                    session, bench_jobs.NewJob("noop", {"i": i}, f"k{i % 50}", uuid.uuid4().hex)
                )
            committed[i] = time.perf_counter()
            await asyncio.sleep(0.01)  # a steady producer rate (100/s), not synchronisation
        # The handler only stamps `started`: poll for the last ones.
        while len(started) < n:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        return [started[i] - committed[i] for i in range(n)]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.dispose()


def p50_p99(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=100)
    return q[49], q[98]


def fresh_pg(dsn: str) -> tuple[str, str]:
    name = f"serentak_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(dsn).set(drivername="postgresql+psycopg", database=name)
    return name, url.render_as_string(hide_password=False)


def drop_databases(dsn: str, names: list[str]) -> None:
    """Drop the databases `fresh_pg` made (their sessions ended by force)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dsn", default=os.environ.get("SERENTAK_TEST_PG_DSN", DEFAULT_DSN))
    parser.add_argument("--sqlite", action="store_true", help="notify on SQLite, not PostgreSQL")
    parser.add_argument("--audience", type=int, action="append")
    parser.add_argument("--streams", type=int, default=100, help="open streams (<= audience)")
    parser.add_argument("--only", choices=["throughput", "latency"])
    parser.add_argument(
        "--streams-on-replica",
        action="store_true",
        help="PostgreSQL: the streams on a second replica (a process of its own), Ingest on "
        "the first: every notification arrives as another replica's commit",
    )
    parser.add_argument(
        "--max-batch", type=int, action="append", help="streams' max_batch (default 1 and 64)"
    )
    args = parser.parse_args()
    if args.streams_on_replica and args.sqlite:
        parser.error("--streams-on-replica needs PostgreSQL (SQLite runs one notify replica)")
    audiences = args.audience or [100, 1000]
    batches = args.max_batch or [1, 64]
    total = 20_000 if args.quick else 60_000  # notifications per throughput run
    seconds = 4 if args.quick else 10  # length of a paced latency run
    names: list[str] = []
    db = "SQLite" if args.sqlite else "PostgreSQL"
    try:
        name, jobs_url = fresh_pg(args.dsn)
        names.append(name)
        lag_n = 100 if args.quick else 500
        print(f"notify: content updates of one file, {db}, clients in a separate process")
        for audience in audiences:
            streams = min(args.streams, audience)
            runs = []
            if args.only != "latency":
                runs += [("throughput", max(2, total // audience), 0.0, b) for b in batches]
            if args.only != "throughput":
                rate = TARGET_RATE / 2 / audience
                runs += [("latency", max(2, int(rate * seconds)), rate, b) for b in batches]
            for kind, events, rate, max_batch in runs:
                with tempfile.TemporaryDirectory() as tmp:
                    if args.sqlite:
                        url = f"sqlite+aiosqlite:///{tmp}/notify.db"
                    else:
                        name, url = fresh_pg(args.dsn)
                        names.append(name)
                    # The baseline brackets each latency run (taken right before and right
                    # after it, pooled): on a shared machine a load swing between a single
                    # baseline and the run would land in one side of the ratio only.
                    before = await job_lag(jobs_url, lag_n) if kind == "latency" else []
                    r = await notify_run(
                        url,
                        Path(tmp),
                        audience,
                        streams,
                        events,
                        rate,
                        max_batch,
                        args.streams_on_replica,
                    )
                    after = await job_lag(jobs_url, lag_n) if kind == "latency" else []
                # The same run against the bare server: the ceiling this machine sets;
                # on PostgreSQL again storing what it delivers, the least a durable
                # service must do (`notify_floor.DurableNotify`).
                floor = await floor_run(audience, streams, events, rate, max_batch)
                durable = None
                if not args.sqlite:
                    name, durable_url = fresh_pg(args.dsn)
                    names.append(name)
                    durable = await floor_run(
                        audience, streams, events, rate, max_batch, durable_url
                    )
                where = " on another replica" if args.streams_on_replica else ""
                head = (
                    f"audience {audience:>5}, {streams} streams{where} (max_batch {max_batch}), "
                    f"{events} events"
                )
                if kind == "throughput":
                    print(
                        f"{head}, as fast as possible: {r['rate']:8.0f} notifications/s "
                        f"({r['rate'] / TARGET_RATE:.2f}x the 10,000/s target; "
                        f"IngestBatch {r['sent_per_s']:.0f} events/s)"
                    )
                    print(
                        f"  {FLOOR}: "
                        f"{floor['rate']:8.0f} notifications/s; notify "
                        f"{r['rate'] / floor['rate']:.2f}x the floor"
                    )
                    if durable is not None:
                        print(
                            f"  {DURABLE_FLOOR}: "
                            f"{durable['rate']:8.0f} notifications/s; notify "
                            f"{r['rate'] / durable['rate']:.2f}x it"
                        )
                else:
                    base50, base99 = p50_p99(before + after)
                    print(
                        f"baseline job runtime lag (commit -> handler) before + after: "
                        f"p50 {base50 * 1000:.1f} ms, p99 {base99 * 1000:.1f} ms "
                        f"(before alone p99 {p50_p99(before)[1] * 1000:.1f}, "
                        f"after {p50_p99(after)[1] * 1000:.1f})"
                    )
                    c50, c99 = p50_p99(r["commit_to_delivery"])
                    print(
                        f"{head} at {rate * audience:.0f} notifications/s: commit -> delivery "
                        f"p50 {c50 * 1000:.1f} ms ({c50 / base50:.2f}x baseline), "
                        f"p99 {c99 * 1000:.1f} ms ({c99 / base99:.2f}x; target 3x); "
                        f"send -> delivery p50 {r['p50'] * 1000:.1f} ms "
                        f"({r['p50'] / base50:.2f}x), p99 {r['p99'] * 1000:.1f} ms "
                        f"({r['p99'] / base99:.2f}x)"
                    )
                    f50, f99 = p50_p99(floor["receipt_to_delivery"])
                    print(
                        f"  {FLOOR}: "
                        f"receipt -> delivery p50 {f50 * 1000:.1f} ms, p99 {f99 * 1000:.1f} ms "
                        f"({f99 / base99:.2f}x baseline); notify p99 {c99 / f99:.2f}x the floor"
                    )
                    if durable is not None:
                        d50, d99 = p50_p99(durable["receipt_to_delivery"])
                        print(
                            f"  {DURABLE_FLOOR}: "
                            f"commit -> delivery p50 {d50 * 1000:.1f} ms, p99 "
                            f"{d99 * 1000:.1f} ms ({d99 / base99:.2f}x baseline); notify p99 "
                            f"{c99 / d99:.2f}x it"
                        )
    finally:
        drop_databases(args.dsn, names)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, stream_port, audience, streams, events = (int(a) for a in sys.argv[2:7])
        rate, max_batch = float(sys.argv[7]), int(sys.argv[8])
        result = asyncio.run(client(port, stream_port, audience, streams, events, rate, max_batch))
        print(json.dumps(result))
    else:
        configure_logging("bench", "console", "WARNING")
        stamp_commits()
        asyncio.run(main())
