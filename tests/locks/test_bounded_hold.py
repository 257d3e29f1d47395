"""Bounded holds: a lock is never extended past SERENTAK_LOCK_MAX_HOLD_SECONDS. Hold then
ends with LOST_REASON_MAX_HOLD_EXCEEDED, the lock is released at once (the next Acquire
gets it without waiting out the TTL), and every renewal before that is counted."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from locks.principals import USER_TOKEN
from prometheus_client import REGISTRY
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from support.bearer import bearer_channel
from support.services import running_app

from services.locks.app import build_app
from services.locks.settings import LocksSettings

pytestmark = pytest.mark.etcd


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_hold_ends_at_the_maximum_and_frees_the_lock(etcd) -> None:
    settings = LocksSettings(
        etcd_endpoint=etcd.endpoint,
        lock_prefix=f"/t/{uuid.uuid4().hex}/",
        lock_max_hold_seconds=2.5,
    )
    renewals = _metric("serentak_lock_renewals_total")
    capped = _metric("serentak_lock_max_hold_exceeded_total")
    async with running_app(build_app(settings)) as svc:
        address = f"127.0.0.1:{svc.app.bound_port}"
        async with bearer_channel(address, USER_TOKEN) as channel:
            stub = locks_pb2_grpc.LockServiceStub(channel)
            key = "user:alice:quota"
            lock = await stub.Acquire(locks_pb2.AcquireRequest(key=key, owner="a", ttl_seconds=30))
            started = time.monotonic()
            call = stub.Hold()
            await call.write(locks_pb2.HoldRequest(key=key, token=lock.token))
            held = 0
            async with asyncio.timeout(20):
                while True:
                    event = await call.read()
                    if event.HasField("lost"):
                        break
                    held += 1
            lasted = time.monotonic() - started
            assert event.lost.reason == locks_pb2.LOST_REASON_MAX_HOLD_EXCEEDED
            # With a 30 s TTL the hold renewed every 10 s: it ended at the cap, not by TTL.
            assert lasted < 10, lasted
            # Freed at once: the lease is revoked, not left to its 30 s TTL.
            again = await stub.Acquire(
                locks_pb2.AcquireRequest(key=key, owner="b", ttl_seconds=5, wait_timeout_ms=5000)
            )
            assert again.token > lock.token
            call.cancel()
    assert _metric("serentak_lock_max_hold_exceeded_total") - capped == 1
    print(f"hold capped after {lasted:.2f} s ({held} held events)")
    assert _metric("serentak_lock_renewals_total") >= renewals


async def test_renewals_are_counted(lock_service) -> None:
    before = _metric("serentak_lock_renewals_total")
    stub = lock_service.stub
    lock = await stub.Acquire(
        locks_pb2.AcquireRequest(key="user:alice:r1", owner="o", ttl_seconds=2)
    )
    call = stub.Hold()
    await call.write(locks_pb2.HoldRequest(key="user:alice:r1", token=lock.token))
    # The first event is the hold's own initial renewal; three more are keeper renewals.
    for _ in range(4):
        event = await asyncio.wait_for(call.read(), 5)
        assert event.HasField("held")
    call.cancel()
    assert _metric("serentak_lock_renewals_total") - before >= 3
