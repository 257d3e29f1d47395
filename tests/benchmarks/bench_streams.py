# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Live streams on one notify replica: memory per idle stream and the time to open them all
at once from one client, beside a bare grpc.aio server holding the same streams.

    .venv/bin/python tests/benchmarks/bench_streams.py [--quick] [--streams N,...]
        [--postgres DSN]

Serentak: `python -m services.notify` as `make run` starts it (SQLite; with `--postgres`
also on a fresh PostgreSQL database), N users' tokens, caps raised to N. One client
process opens N Subscribe streams at once on one channel (5 devices a user) and waits
until every stream has its first message (the "now" cursor); open time runs from the
first call to the last first message. Memory per stream: the replica's RSS after the
streams are open and idle, minus its RSS before, over N.

The floor, in the same run: a bare grpc.aio server in a process of its own (the same
Python, grpc and options, no auth, no database, no broker) whose one server-streaming
method sends one message and then waits, the way an idle Subscribe does; the same client
opens N streams to it. What it costs is what grpc.aio costs per stream on this machine;
the ratios say what notify adds. The issue's goal: <= 20 KiB a stream idle (below what
grpc.aio alone costs here); the stated budget a replica is sized by: <= 32 KiB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "client"), str(REPO / "tests")]

import grpc
import psycopg
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from sqlalchemy.engine import make_url
from support.ports import free_port
from support.services import service_process, wait_serving

DEVICES_PER_USER = 5
GOAL_KIB = 20.0
# The stated budget (docs/services.md, notify capacity): what a replica is sized by.
BUDGET_KIB = 32.0

FLOOR_SERVER = textwrap.dedent(
    """
    import asyncio, sys
    import grpc

    async def subscribe(request, context):
        yield b"now"
        await asyncio.Event().wait()  # idle, as a Subscribe with nothing to send

    async def main(port):
        server = grpc.aio.server(options=[
            ("grpc.server.max_pending_requests", 100000),
            ("grpc.server.max_pending_requests_hard_limit", 200000),
        ])
        handler = grpc.method_handlers_generic_handler(
            "floor.Streams",
            {"Subscribe": grpc.unary_stream_rpc_method_handler(subscribe)},
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        from grpc_health.v1 import health, health_pb2_grpc
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        await server.wait_for_termination()

    asyncio.run(main(int(sys.argv[1])))
    """
)


def rss(pid: int) -> int:
    """Resident bytes of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def settle(pid: int) -> int:
    """RSS once it stops moving (the server has finished setting the streams up)."""
    last = rss(pid)
    for _ in range(20):
        await asyncio.sleep(0.25)  # a measurement interval, not a synchronisation
        now = rss(pid)
        if abs(now - last) < 256 * 1024:
            return now
        last = now
    return last


async def open_streams(address: str, pid: int, n: int, serentak: bool) -> tuple[float, float]:
    """(seconds to open n streams at once, KiB of server RSS per idle stream)."""
    channel = grpc.aio.insecure_channel(address)
    if serentak:
        stub = notify_pb2_grpc.NotifyServiceStub(channel)
    else:
        call_floor = channel.unary_stream("/floor.Streams/Subscribe")
    before = await settle(pid)
    started = time.perf_counter()
    calls = []
    for i in range(n):
        if serentak:
            user = i // DEVICES_PER_USER
            calls.append(
                stub.Subscribe(
                    notify_pb2.SubscribeRequest(device_id=f"d{i}"),
                    metadata=(("authorization", f"Bearer tok-u{user}"),),
                )
            )
        else:
            calls.append(call_floor(b""))
    firsts = await asyncio.gather(*(c.read() for c in calls), return_exceptions=True)
    opened = time.perf_counter() - started
    failed = [f for f in firsts if isinstance(f, BaseException) or f is grpc.aio.EOF]
    if failed:
        raise RuntimeError(f"{len(failed)} of {n} streams never started: {failed[:2]}")
    after = await settle(pid)
    for call in calls:
        call.cancel()
    await channel.close()
    return opened, (after - before) / n / 1024


def notify_env(n: int) -> dict[str, str]:
    """Settings for a replica holding n streams of n / 5 users of one tenant."""
    users = n // DEVICES_PER_USER + 1
    tokens = {f"tok-u{u}": {"tenant_id": "acme", "user_id": f"u{u}"} for u in range(users)}
    import json

    return {
        "SERENTAK_AUTH_TOKENS": json.dumps(tokens),
        "SERENTAK_STREAMS_MAX": str(n + 100),
        "SERENTAK_STREAMS_PER_TENANT_MAX": str(n + 100),
        "SERENTAK_LOG_LEVEL": "WARNING",
    }


def postgres_database(admin_dsn: str) -> tuple[str, str]:
    """A fresh database on the server of `admin_dsn`: (its SQLAlchemy URL, its name)."""
    name = f"bench_streams_{os.getpid()}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(admin_dsn).set(drivername="postgresql", database=name)
    return url.render_as_string(hide_password=False), name


async def measure(n: int, tmp: Path, database_url: str | None) -> tuple[float, float]:
    env = notify_env(n)
    if database_url:
        env["SERENTAK_NOTIFY_DATABASE_URL"] = database_url
    with service_process("notify", tmp, env) as svc:
        return await open_streams(svc.address, svc.process.pid, n, serentak=True)


def start_floor(port: int) -> subprocess.Popen[bytes]:
    """The bare grpc.aio server, in a process of its own."""
    return subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, str(port)], cwd=REPO)


async def measure_floor(n: int) -> tuple[float, float]:
    port = free_port()
    process = start_floor(port)
    try:
        wait_serving(f"127.0.0.1:{port}")
        return await open_streams(f"127.0.0.1:{port}", process.pid, n, serentak=False)
    finally:
        process.kill()
        process.wait()


async def bench(args: argparse.Namespace) -> None:
    rows = []
    for n in args.streams:
        floor = await measure_floor(n)
        with tempfile.TemporaryDirectory(prefix="bench_streams_") as tmp:
            rows.append(("SQLite", n, await measure(n, Path(tmp), None), floor))
        if args.postgres:
            url, name = postgres_database(args.postgres)
            try:
                with tempfile.TemporaryDirectory(prefix="bench_streams_") as tmp:
                    rows.append(("PostgreSQL", n, await measure(n, Path(tmp), url), floor))
            finally:
                with psycopg.connect(args.postgres, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print("live streams on one notify replica vs a bare grpc.aio server (same client, same run)")
    print(
        f"{'db':<11}{'streams':>8} | {'open s':>7} {'floor s':>8} {'ratio':>6} | "
        f"{'KiB/stream':>10} {'floor':>6} {'ratio':>6} | goal <= {GOAL_KIB:.0f} KiB | "
        f"budget <= {BUDGET_KIB:.0f} KiB"
    )
    for db, n, (opened, kib), (f_opened, f_kib) in rows:
        print(
            f"{db:<11}{n:>8} | {opened:>7.2f} {f_opened:>8.2f} {opened / f_opened:>6.2f} | "
            f"{kib:>10.1f} {f_kib:>6.1f} {kib / max(f_kib, 0.1):>6.2f} | "
            f"{'yes' if kib <= GOAL_KIB else 'no':>15} | {'yes' if kib <= BUDGET_KIB else 'no'}"
        )


def main() -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 streams only, SQLite only")
    parser.add_argument("--streams", help="comma list of stream counts (default 2000,10000)")
    parser.add_argument("--postgres", metavar="DSN", default=os.environ.get("SERENTAK_TEST_PG_DSN"))
    args = parser.parse_args()
    default = "2000" if args.quick else "2000,10000"
    args.streams = [int(n) for n in (args.streams or default).split(",")]
    if args.quick:
        args.postgres = None
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
