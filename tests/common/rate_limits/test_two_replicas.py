"""Limits hold across replicas: two service processes on one shared store admit, all
together, what one would: two notify processes on one PostgreSQL database, two lock
service processes on one etcd. Calls alternate between the replicas and race; each
replica's own metrics count its refusals by family and scope."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from support.etcd import EtcdServer
from support.grpc_errors import error_info, retry_delay
from support.services import ServiceProcess, service_process

pytestmark = [pytest.mark.slow]
# One window of a day: a test never straddles two (checked, `same_window`).
WINDOW = 86_400


def folder(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def same_window(started: float) -> None:
    assert started // WINDOW == time.time() // WINDOW, "straddled a window: run it again"


def refused_metric(svc: ServiceProcess, family: str, scope: str) -> float:
    """This replica's serentak_rate_limited_total for one family and scope."""
    url = f"http://127.0.0.1:{svc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    pattern = (
        rf'^serentak_rate_limited_total{{family="{family}",scope="{scope}",'
        rf'service="\w+"}} (\S+)$'
    )
    match = re.search(pattern, text, re.M)
    return float(match.group(1)) if match else 0.0


async def outcomes(calls) -> Counter[str]:
    """Status code names of racing calls (OK for an answer)."""

    async def one(call) -> str:
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                info = error_info(exc)
                assert info.reason == "RATE_LIMITED"
                assert 0 < retry_delay(exc) <= WINDOW
                return f"limited:{info.metadata['scope']}"
            return exc.code().name
        return "OK"

    return Counter(await asyncio.gather(*(one(c) for c in calls)))


@pytest.mark.postgres
async def test_two_notify_replicas_on_one_database_share_each_limit(
    postgres, tmp_path: Path
) -> None:
    env = {
        "SERENTAK_NOTIFY_DATABASE_URL": postgres.create(),
        "SERENTAK_RATE_LIMIT_WINDOW_SECONDS": str(WINDOW),
        "SERENTAK_RATE_LIMIT_INBOX_PER_USER": "25",
        "SERENTAK_RATE_LIMIT_INBOX_PER_TENANT": "40",
    }
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(service_process("notify", folder(tmp_path, name), env))
            for name in ("a", "b")
        ]
        channels = [grpc.aio.insecure_channel(r.address) for r in replicas]
        stubs = [notify_pb2_grpc.NotifyServiceStub(c) for c in channels]
        try:

            def unread_counts(token: str, n: int):
                request = notify_pb2.GetUnreadCountRequest()
                return [stubs[i % 2].GetUnreadCount(request, metadata=md(token)) for i in range(n)]

            started = time.time()
            # Per user: alice's 80 calls over both replicas, 25 answered (not 50).
            alice = await outcomes(unread_counts("dev-alice", 80))
            # Per tenant (40): bob, of alice's tenant, gets what is left of it, 15.
            bob = await outcomes(unread_counts("dev-bob", 80))
            carol = await outcomes(unread_counts("dev-carol", 10))
            # Another tenant has windows of its own.
            mallory = await outcomes(unread_counts("dev-mallory", 30))
            same_window(started)
        finally:
            for channel in channels:
                await channel.close()
        assert alice == {"OK": 25, "limited:user": 55}
        # Bob is admitted what is left of the tenant's 40. His refusals name the tenant,
        # but some may name bob: a call holds a unit of bob's key while it asks for the
        # tenant's, so with 80 in flight bob's 25 can all be held at once by calls the
        # tenant then refuses (the units go back after). The count admitted is exact.
        assert bob["OK"] == 15 and bob["limited:tenant"] > 0, bob
        assert bob["limited:tenant"] + bob["limited:user"] == 65, bob
        assert carol == {"limited:tenant": 10}
        assert mallory == {"OK": 25, "limited:user": 5}
        # Each replica refused its share, and says so.
        for scope, total in (
            ("user", 55 + 5 + bob["limited:user"]),
            ("tenant", 65 + 10 - bob["limited:user"]),
        ):
            counted = [refused_metric(r, "inbox", scope) for r in replicas]
            assert sum(counted) == total and all(counted), (scope, counted)


@pytest.mark.etcd
async def test_two_lock_replicas_on_one_etcd_share_the_acquire_limit(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    env = {
        "SERENTAK_ETCD_ENDPOINT": etcd.endpoint,
        "SERENTAK_LOCK_PREFIX": f"/t/{uuid.uuid4().hex}/",
        "SERENTAK_RATE_LIMIT_WINDOW_SECONDS": str(WINDOW),
        "SERENTAK_RATE_LIMIT_ACQUIRE_PER_USER": "20",
    }
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(service_process("locks", folder(tmp_path, name), env))
            for name in ("a", "b")
        ]
        channels = [grpc.aio.insecure_channel(r.address) for r in replicas]
        stubs = [locks_pb2_grpc.LockServiceStub(c) for c in channels]
        try:

            def acquires(token: str, key: str, n: int):
                return [
                    stubs[i % 2].Acquire(
                        locks_pb2.AcquireRequest(
                            key=key.format(i=i),
                            owner="t",
                            ttl_seconds=5,
                            tenant_id="acme",
                        ),
                        metadata=md(token),
                    )
                    for i in range(n)
                ]

            started = time.time()
            alice = await outcomes(acquires("dev-alice", "user:alice:k{i}", 60))
            # The upload service's merges (a service principal) are never limited.
            merges = await outcomes(acquires("dev-service-upload", "file:f{i}", 60))
            same_window(started)
        finally:
            for channel in channels:
                await channel.close()
        assert alice == {"OK": 20, "limited:user": 40}
        assert merges == {"OK": 60}
