# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Large audiences: a new version of a file shared with N users, every one of them with a
live Subscribe stream; how long from its commit until the last stream has it.

    .venv/bin/python tests/benchmarks/bench_audience.py [--quick] [--dsn DSN]
        [--audience 100 --audience 1000 --audience 10000] [--events E]

Per audience N, on a fresh PostgreSQL database each:
- one replica: notify in this process takes the IngestBatch and holds the N streams;
- two replicas: the streams spread over two (every other user on a second replica, a
  process of its own, reached as another replica's commit: NOTIFY, read, delivery);
- the durable floor, same run and client: a bare grpc.aio server storing each event's
  inbox row and N notifications in PostgreSQL (one transaction, notify's own fan-out
  statement), then handing them to the streams (`notify_floor.DurableNotify`).
The client, a process of its own, opens the N streams at once (one per user), then sends
E content updates one at a time as the outbox relay does (IngestBatch, its 10 s deadline):
each goes once every stream has the one before, so each fan-out is measured alone.
Printed per run: commit -> delivery p50/p99 over all E x N deliveries, the last delivery
of each event (p50 and max), the issue's target (p99 <= 1 s), whether every user's inbox
holds exactly one notification per version, and what the sender saw from notify
(RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED must never happen). The commit is stamped in the
service process by the first `after_commit` listener of the writing transaction, the
delivery when the client's read returns, both on CLOCK_MONOTONIC (`time.perf_counter`).
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]

import grpc
import psycopg
from bench_notify import (
    COMMITTED,
    DEFAULT_DSN,
    content_update,
    drop_databases,
    fresh_pg,
    stamp_commits,
    users,
)
from notify_floor import serve
from notify_replica import replica_process, replica_settings
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.sdk import notifications_in
from sqlalchemy.engine import make_url
from support.services import running_app

from services.common.jobs.listener import libpq_url
from services.common.logging import configure_logging
from services.notify.app import build_app
from services.notify.database import prepare

TARGET_P99_S = 1.0
RELAY_TIMEOUT_S = 10.0  # the outbox relay's IngestBatch deadline (GrpcIngestSubscriber)
SERVICE_MD = (("authorization", "Bearer dev-service-upload"),)
RETRIED = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


# --- the client process ---------------------------------------------------------------


async def client(ports: list[int], audience: int, events: int) -> dict:
    """Open one stream per user (user i on ports[i % len(ports)]), send `events` content
    updates one at a time to ports[0], each once every stream has the previous one."""
    ids = users(audience)
    received: dict[int, list[float]] = {v: [] for v in range(1, events + 1)}
    refused: dict[str, int] = {}
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}") for p in ports]
    try:
        stubs = [notify_pb2_grpc.NotifyServiceStub(c) for c in channels]
        opening = time.perf_counter()
        calls = [
            stubs[i % len(stubs)].Subscribe(
                notify_pb2.SubscribeRequest(device_id="bench", max_batch=64),
                metadata=(("authorization", f"Bearer tok-{u}"),),
            )
            for i, u in enumerate(ids)
        ]
        firsts = await asyncio.gather(*(c.read() for c in calls), return_exceptions=True)
        failed = [f for f in firsts if isinstance(f, BaseException)]
        if failed:  # every stream must start: this run measures nothing else
            raise RuntimeError(f"{len(failed)} of {len(calls)} streams never started: {failed[0]}")
        opened = time.perf_counter() - opening
        progress = [0] * len(calls)
        reached = {v: asyncio.Event() for v in received}
        behind = {v: len(calls) for v in received}

        async def drain(i: int, call: grpc.aio.UnaryStreamCall) -> None:
            while progress[i] < events:
                item = await call.read()
                now = time.perf_counter()
                for n in notifications_in(item):
                    received[n.version].append(now)
                    progress[i] = n.version
                    behind[n.version] -= 1
                    if behind[n.version] == 0:
                        reached[n.version].set()

        readers = [asyncio.create_task(drain(i, c)) for i, c in enumerate(calls)]
        for v in range(1, events + 1):
            batch = notify_pb2.IngestBatchRequest(events=[content_update(v, ids)])
            while True:  # as the relay: a failed call is sent again
                try:
                    await stubs[0].IngestBatch(batch, metadata=SERVICE_MD, timeout=RELAY_TIMEOUT_S)
                    break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in RETRIED:
                        raise
                    refused[exc.code().name] = refused.get(exc.code().name, 0) + 1
            async with asyncio.timeout(120):
                await reached[v].wait()
        async with asyncio.timeout(60):
            await asyncio.gather(*readers)
        for call in calls:
            call.cancel()
    finally:
        for channel in channels:
            await channel.close()
    return {"received": received, "refused": refused, "opened": opened}


async def run_client(ports: list[int], audience: int, events: int) -> dict:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--client",
        ",".join(map(str, ports)),
        str(audience),
        str(events),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"client failed ({proc.returncode})")
    result = json.loads(out.decode().strip().splitlines()[-1])
    result["received"] = {int(v): ts for v, ts in result["received"].items()}
    return result


# --- the service process --------------------------------------------------------------


def inbox_check(url: str, audience: int, events: int) -> str:
    """'exactly once' when every user holds one notification per version, else what not."""
    with psycopg.connect(libpq_url(make_url(url))) as conn:
        total, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT (user_id, version)) FROM notifications"
        ).fetchone()
    expected = audience * events
    if total == distinct == expected:
        return "exactly once"
    return f"NOT exactly once: {total} rows, {distinct} distinct, {expected} expected"


async def notify_runs(url: str, audience: int, events: int, two: bool) -> dict:
    """The run on notify (one replica, or the streams spread over two)."""
    COMMITTED.clear()
    with tempfile.TemporaryDirectory() as tmp:
        settings = replica_settings(url, Path(tmp), users(audience))
        async with running_app(build_app(settings)) as service:
            ports = [service.app.bound_port]
            async with contextlib.AsyncExitStack() as stack:
                if two:
                    ports.append(
                        await stack.enter_async_context(replica_process(url, audience, COMMITTED))
                    )
                r = await run_client(ports, audience, events)
    r["spans"] = {v: [t - COMMITTED[v] for t in ts] for v, ts in r.pop("received").items()}
    r["inbox"] = inbox_check(url, audience, events)
    return r


async def floor_runs(url: str, audience: int, events: int) -> dict:
    """The same client against the durable floor (notify's schema, one raw connection)."""
    prepare(url, migrate_on_start=True)
    async with await psycopg.AsyncConnection.connect(libpq_url(make_url(url))) as connection:
        server, servicer, port = await serve(connection)
        try:
            r = await run_client([port], audience, events)
        finally:
            await server.stop(None)
    r["spans"] = {v: [t - servicer.received[v] for t in ts] for v, ts in r.pop("received").items()}
    r["inbox"] = inbox_check(url, audience, events)
    return r


def summary(r: dict) -> tuple[float, float, float, float]:
    """(p50, p99 over every delivery, p50 and max of each event's last delivery), ms."""
    every = [s for spans in r["spans"].values() for s in spans]
    q = statistics.quantiles(every, n=100)
    lasts = [max(spans) for spans in r["spans"].values()]
    return q[49] * 1e3, q[98] * 1e3, statistics.median(lasts) * 1e3, max(lasts) * 1e3


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="audiences 100 and 1,000 only")
    parser.add_argument("--dsn", default=os.environ.get("SERENTAK_TEST_PG_DSN", DEFAULT_DSN))
    parser.add_argument("--audience", type=int, action="append")
    parser.add_argument("--events", type=int, help="versions sent per run (default by N)")
    parser.add_argument("--only", choices=["one", "two", "floor"], help="one of the three runs")
    args = parser.parse_args()
    audiences = args.audience or ([100, 1000] if args.quick else [100, 1000, 10_000])
    names: list[str] = []
    print("a new version to N users, each with a live stream; PostgreSQL; client in a process")
    print(
        f"{'N':>6} {'where':<28} | {'open s':>6} | commit -> delivery ms: {'p50':>6} {'p99':>6} "
        f"| last: {'p50':>6} {'max':>6} | p99 <= 1 s | inbox | refused"
    )
    try:
        for n in audiences:
            events = args.events or (20 if n <= 100 else 10 if n <= 1000 else 5)
            plan = [("one replica", False), ("two replicas, streams spread", True), ("floor", None)]
            if args.only:
                plan = [plan[["one", "two", "floor"].index(args.only)]]
            for label, two in plan:
                name, url = fresh_pg(args.dsn)
                names.append(name)
                if two is None:
                    label = "durable floor (bare + PG)"
                    r = await floor_runs(url, n, events)
                else:
                    r = await notify_runs(url, n, events, two)
                p50, p99, last50, last_max = summary(r)
                met = "yes" if p99 <= TARGET_P99_S * 1e3 else "no"
                print(
                    f"{n:>6} {label:<28} | {r['opened']:>6.1f} | {'':>22}{p50:>6.0f} {p99:>6.0f} "
                    f"|       {last50:>6.0f} {last_max:>6.0f} | {met:>10} | {r['inbox']} | "
                    f"{r['refused'] or 'none'}"
                )
    finally:
        drop_databases(args.dsn, names)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        ports = [int(p) for p in sys.argv[2].split(",")]
        result = asyncio.run(client(ports, int(sys.argv[3]), int(sys.argv[4])))
        print(json.dumps(result))
    else:
        configure_logging("bench", "console", "WARNING")
        stamp_commits()
        asyncio.run(main())
