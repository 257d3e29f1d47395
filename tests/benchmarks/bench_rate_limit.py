"""Cost of a rate limit check per call: no limiter, in memory, PostgreSQL, etcd.

    .venv/bin/python tests/benchmarks/bench_rate_limit.py [--quick] [--postgres DSN]

Measures, in one run, for each store (services/common/rate_limits/):
1. the check alone: `MethodRate.take` for one user (its user key and its tenant's), µs per
   check, sequential;
2. a unary gRPC call (Health/Check, limited as a family of its own) to an in-process
   server over plaintext, dev-mode auth, on a warm connection: p50 and p99 per call, and
   the difference to the same call with no limiter.

The stores: memory (a SQLite service's), PostgreSQL (SERENTAK_TEST_PG_DSN or --postgres;
the `rate_limit_counters` table of a fresh database), and etcd (a private member); the
shared ones twice: as configured (reservations of up to 32 units: one store round trip
per 32 checks of a key) and with batch_max 1 (a round trip every check), which is the
price of an exact count at small limits. Limits are far above what the run spends, so
every call is admitted. Prints µs and ratios to the in-memory limiter and to no limiter.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from support.etcd import EtcdServer  # noqa: E402
from support.postgres import PostgresDatabases  # noqa: E402

from services.common.auth import Authenticator, Identity  # noqa: E402
from services.common.grpc_server import ServiceApp, start  # noqa: E402
from services.common.logging import configure_logging  # noqa: E402
from services.common.migrate import upgrade  # noqa: E402
from services.common.rate_limits import (  # noqa: E402
    CounterStore,
    FamilyLimits,
    Limiter,
    MemoryCounterStore,
    PostgresCounterStore,
    RateGate,
    RatePolicy,
    Rule,
)
from services.common.rate_limits.schema import migration_location  # noqa: E402
from services.common.security import ServerSecurity  # noqa: E402
from services.locks.etcd_client import Etcd  # noqa: E402
from services.locks.rate_store import EtcdCounterStore  # noqa: E402

CHECK = "/grpc.health.v1.Health/Check"
ALICE = Identity(tenant_id="acme", user_id="alice")
MD = (("authorization", "Bearer dev-alice"),)
BIG = 10**9  # never reached: every call is admitted
WINDOW = 3600.0


def policy() -> RatePolicy:
    return RatePolicy("bench", WINDOW, {"bench": FamilyLimits(BIG, BIG)}, {"Check": Rule("bench")})


async def check_us(gate: RateGate, n: int) -> float:
    """Mean µs of one check (user and tenant keys), n in a row."""
    rate = gate.for_method(CHECK)
    assert rate is not None
    await rate.take(ALICE)  # the first reservation and connection are not the steady state
    started = time.perf_counter()
    for _ in range(n):
        await rate.take(ALICE)
    return (time.perf_counter() - started) / n * 1e6


async def call_us(gate: RateGate | None, n: int) -> tuple[float, float]:
    """(p50, p99) µs of a Health/Check call through a server limited by `gate`."""
    security = ServerSecurity("dev", None, Authenticator.dev())
    running = await start(ServiceApp("bench", "127.0.0.1", 0, 0, [], security=security, rates=gate))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.app.bound_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest()
            for _ in range(200):  # warm the connection and the first reservation
                await stub.Check(request, metadata=MD)
            times = []
            for _ in range(n):
                began = time.perf_counter()
                await stub.Check(request, metadata=MD)
                times.append((time.perf_counter() - began) * 1e6)
    finally:
        await running.stop()
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


@asynccontextmanager
async def postgres_store(dsn: str | None) -> AsyncIterator[Callable[[], CounterStore] | None]:
    if not dsn:
        yield None
        return
    databases = PostgresDatabases(dsn)
    url = databases.create()
    upgrade(url, [migration_location()])
    stores: list[PostgresCounterStore] = []

    def make() -> CounterStore:
        stores.append(PostgresCounterStore(make_url(url)))
        return stores[-1]

    try:
        yield make
    finally:
        for store in stores:
            await store.close()
        databases.drop_all()


@asynccontextmanager
async def etcd_store(folder: Path) -> AsyncIterator[Callable[[], CounterStore] | None]:
    try:
        server = EtcdServer(folder / "etcd")
    except RuntimeError:
        yield None
        return
    server.start()
    client = Etcd(server.endpoint, call_timeout=5)
    try:
        yield lambda: EtcdCounterStore(client, "/bench/", WINDOW)
    finally:
        await client.close()
        server.stop()


async def main(quick: bool, dsn: str | None) -> None:
    configure_logging("bench", "console", "WARNING")
    n_check, n_call = (300, 300) if quick else (3000, 2000)
    async with AsyncExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        pg = await stack.enter_async_context(postgres_store(dsn))
        etcd = await stack.enter_async_context(etcd_store(folder))
        stores: list[tuple[str, Callable[[], CounterStore], int]] = [
            ("memory", MemoryCounterStore, 32)
        ]
        for name, make in (("postgresql", pg), ("etcd", etcd)):
            if make is None:
                print(f"({name}: not available, skipped)")
                continue
            stores += [(name, make, 32), (f"{name}, batch 1", make, 1)]

        def gate(make: Callable[[], CounterStore], batch: int) -> RateGate:
            limiter = Limiter(make(), service="bench", window_seconds=WINDOW, batch_max=batch)
            return RateGate(policy(), limiter, Authenticator.dev())

        base50, base99 = await call_us(None, n_call)
        rows = []
        for name, make, batch in stores:
            check = await check_us(gate(make, batch), n_check)
            p50, p99 = await call_us(gate(make, batch), n_call)
            rows.append((name, check, p50, p99))
    memory_check = rows[0][1]
    print(f"rate limit check, {n_check} checks and {n_call} calls per store (one user)")
    header = ("limiter", "check µs", "x memory", "call p50", "p99", "+p50 µs")
    print(
        f"{header[0]:<22}{header[1]:>10}{header[2]:>10}{header[3]:>10}{header[4]:>9}{header[5]:>9}"
    )
    print(f"{'none':<22}{'-':>10}{'-':>10}{base50:>10.0f}{base99:>9.0f}{0:>9.0f}")
    for name, check, p50, p99 in rows:
        print(
            f"{name:<22}{check:>10.1f}{check / memory_check:>10.1f}"
            f"{p50:>10.0f}{p99:>9.0f}{p50 - base50:>9.0f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--postgres", default=os.environ.get("SERENTAK_TEST_PG_DSN"))
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.postgres))
