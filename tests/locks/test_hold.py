"""Hold streams and the LockClient helper: keepalive, and loss reported the moment it happens."""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import pytest
from locks.principals import USER_TOKEN
from serentak.errors import LockHeld, LockLost
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from serentak.sdk.locks import LockClient
from support.bearer import bearer_channel
from support.services import running_app

from services.locks.app import build_app
from services.locks.settings import LocksSettings

pytestmark = pytest.mark.etcd


class HoldStream:
    """A Hold call driven by hand: write the first message, read events."""

    def __init__(self, stub: locks_pb2_grpc.LockServiceStub, key: str, token: int) -> None:
        self.call = stub.Hold()
        self.key, self.token = key, token

    async def open(self) -> locks_pb2.HoldEvent:
        await self.call.write(locks_pb2.HoldRequest(key=self.key, token=self.token))
        return await self.call.read()

    async def until_lost(self, within: float) -> tuple[locks_pb2.Lost, int]:
        """Read until `lost`; returns it and how many `held` renewals came first."""
        renewals = 0
        async with asyncio.timeout(within):
            while True:
                event = await self.call.read()
                assert event is not grpc.aio.EOF, "stream ended without a lost event"
                if event.HasField("lost"):
                    return event.lost, renewals
                renewals += 1


async def test_hold_keeps_the_lease_alive_past_its_ttl_then_reports_release(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    lock = await stub.Acquire(
        locks_pb2.AcquireRequest(key="user:alice:h1", owner="o", ttl_seconds=2)
    )
    hold = HoldStream(stub, "user:alice:h1", lock.token)
    assert (await hold.open()).held.token == lock.token
    # Three TTLs later the lock is still ours (the service renewed it).
    renewals = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        event = await asyncio.wait_for(hold.call.read(), 3)
        assert event.HasField("held")
        renewals += 1
    assert renewals >= 6
    state = await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:h1"))
    assert state.lock.token == lock.token
    await stub.Release(locks_pb2.ReleaseRequest(key="user:alice:h1", token=lock.token))
    lost, _ = await hold.until_lost(3)
    assert lost.reason == locks_pb2.LOST_REASON_KEY_DELETED
    hold.call.cancel()


async def test_hold_reports_lease_expiry_and_wrong_token(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    lock = await stub.Acquire(
        locks_pb2.AcquireRequest(key="user:alice:h2", owner="o", ttl_seconds=30)
    )
    wrong = HoldStream(stub, "user:alice:h2", lock.token + 1)
    first = await wrong.open()
    assert first.lost.reason == locks_pb2.LOST_REASON_NOT_HOLDER
    hold = HoldStream(stub, "user:alice:h2", lock.token)
    assert (await hold.open()).HasField("held")
    await lock_service.etcd.revoke_lease(lock.lease_id)  # as if the lease expired
    lost, _ = await hold.until_lost(5)
    assert lost.reason == locks_pb2.LOST_REASON_LEASE_EXPIRED
    hold.call.cancel()


async def test_closing_the_hold_stream_lets_the_lease_expire(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    lock = await stub.Acquire(
        locks_pb2.AcquireRequest(key="user:alice:h3", owner="o", ttl_seconds=2)
    )
    hold = HoldStream(stub, "user:alice:h3", lock.token)
    await hold.open()
    hold.call.cancel()
    # Without renewals the lease (and the lock) is gone within about one TTL.
    nxt = await stub.Acquire(
        locks_pb2.AcquireRequest(
            key="user:alice:h3", owner="next", ttl_seconds=5, wait_timeout_ms=8000
        )
    )
    assert nxt.token > lock.token


async def test_lock_client_cancels_the_body_and_raises_when_the_lock_is_lost(lock_service) -> None:  # type: ignore[no-untyped-def]
    client = LockClient(lock_service.address, owner="helper", token=USER_TOKEN)
    never = asyncio.Event()
    body_cancelled = False
    try:
        with pytest.raises(LockLost) as caught:
            async with client.hold("user:alice:h4", ttl=5) as lock:
                await lock_service.etcd.revoke_lease(lock.lock.lease_id)
                try:
                    await asyncio.wait_for(never.wait(), 10)
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
        assert body_cancelled
        assert caught.value.metadata["lost_reason"] == "LOST_REASON_LEASE_EXPIRED"
        # A busy holder gets LockHeld from the helper, and a normal exit releases.
        async with client.hold("user:alice:h5", ttl=5) as held:
            with pytest.raises(LockHeld):
                async with client.hold("user:alice:h5", ttl=5, wait_timeout=0):
                    pass
            token = held.token
        state = await lock_service.stub.Describe(locks_pb2.DescribeRequest(key="user:alice:h5"))
        assert not state.held and token > 0
    finally:
        await client.close()


async def test_hold_reports_loss_within_one_ttl_when_etcd_stops_and_recovers(etcd_factory) -> None:  # type: ignore[no-untyped-def]
    etcd = etcd_factory()
    settings = LocksSettings(
        etcd_endpoint=etcd.endpoint,
        lock_prefix=f"/t/{uuid.uuid4().hex}/",
        etcd_call_timeout_seconds=1.0,
    )
    ttl = 3
    async with running_app(build_app(settings)) as svc:
        async with bearer_channel(f"127.0.0.1:{svc.app.bound_port}", "dev-alice") as channel:
            stub = locks_pb2_grpc.LockServiceStub(channel)
            lock = await stub.Acquire(
                locks_pb2.AcquireRequest(key="user:alice:e1", owner="o", ttl_seconds=ttl)
            )
            hold = HoldStream(stub, "user:alice:e1", lock.token)
            assert (await hold.open()).HasField("held")
            await asyncio.to_thread(etcd.stop)
            stopped = time.monotonic()
            lost, _ = await hold.until_lost(ttl + 5)
            elapsed = time.monotonic() - stopped
            assert lost.reason == locks_pb2.LOST_REASON_ETCD_UNREACHABLE
            assert elapsed <= ttl + 0.5, f"loss reported {elapsed:.2f}s after etcd stopped"

            # While etcd is down, RPCs answer UNAVAILABLE with a reason, never INTERNAL.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:e1"))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

            await asyncio.to_thread(etcd.start)
            # The declared-lost lease is revoked on reconnect, so the lock is free again
            # long before etcd's renewed TTL would have run out.
            nxt = await stub.Acquire(
                locks_pb2.AcquireRequest(
                    key="user:alice:e1", owner="after", ttl_seconds=30, wait_timeout_ms=20_000
                )
            )
            assert nxt.token > lock.token
            stale = await stub.Release(
                locks_pb2.ReleaseRequest(key="user:alice:e1", token=lock.token)
            )
            assert not stale.released
            hold.call.cancel()
