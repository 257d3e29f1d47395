"""Acquire / Refresh / Release / Describe / List against the service on a real etcd."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from locks.lock_assertions import wait_for_waiters
from prometheus_client import REGISTRY
from serentak.locks.v1 import locks_pb2
from support.grpc_errors import error_info

from services.locks.keys import KeySpace

pytestmark = pytest.mark.etcd


def acquire(key: str, owner: str, ttl: int = 10, wait_ms: int = 0) -> locks_pb2.AcquireRequest:
    return locks_pb2.AcquireRequest(key=key, owner=owner, ttl_seconds=ttl, wait_timeout_ms=wait_ms)


async def test_uncontended_acquire_then_release(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    lock = await stub.Acquire(acquire("user:alice:1", "alice", ttl=7))
    assert (lock.key, lock.owner, lock.ttl_seconds) == ("user:alice:1", "alice", 7)
    assert lock.token > 0 and lock.lease_id != 0
    assert 6 <= lock.expires_at.ToSeconds() - lock.acquired_at.ToSeconds() <= 8
    state = await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:1"))
    assert state.held and state.lock.token == lock.token and state.lock.owner == "alice"
    assert state.lock.correlation_id == lock.correlation_id != ""
    released = await stub.Release(locks_pb2.ReleaseRequest(key="user:alice:1", token=lock.token))
    assert released.released
    again = await stub.Release(locks_pb2.ReleaseRequest(key="user:alice:1", token=lock.token))
    assert not again.released
    assert not (await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:1"))).held


async def test_try_lock_and_timed_out_wait_leave_no_waiter(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    held = await stub.Acquire(acquire("user:alice:2", "alice", ttl=20))
    for wait_ms in (0, 300):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Acquire(acquire("user:alice:2", "bob", wait_ms=wait_ms))
        assert caught.value.code() == grpc.StatusCode.ABORTED
        info = error_info(caught.value)
        assert info.reason == "LOCK_HELD"
        # The holder's own principal may see who holds it, never the token (issue 33).
        assert info.metadata["holder_owner"] == "alice"
        assert "holder_token" not in info.metadata
        assert str(held.token) not in info.metadata.values()
        assert str(held.token) not in caught.value.details()
        assert info.metadata["holder_expires_at"].endswith("Z")
    state = await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:2"))
    assert state.lock.token == held.token and list(state.waiters) == []
    keys = await lock_service.etcd.by_create_revision(KeySpace(lock_service.prefix).root)
    # Only the holder's key is left in etcd (beside the rate limiter's counts: rate_store.py).
    assert len([k for k in keys if b"/_rate/" not in k.key]) == 1


async def test_release_with_wrong_or_stale_token_changes_nothing(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    first = await stub.Acquire(acquire("user:alice:3", "alice"))
    assert (
        await stub.Release(locks_pb2.ReleaseRequest(key="user:alice:3", token=first.token))
    ).released
    second = await stub.Acquire(acquire("user:alice:3", "bob"))
    assert second.token > first.token
    # A retried release of the first holder (etcd #22082) and a made-up token.
    for token in (first.token, second.token + 1000, second.token - 1):
        resp = await stub.Release(locks_pb2.ReleaseRequest(key="user:alice:3", token=token))
        assert not resp.released
    state = await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:3"))
    assert state.held and state.lock.token == second.token and state.lock.owner == "bob"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Refresh(locks_pb2.RefreshRequest(key="user:alice:3", token=first.token))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(caught.value).reason == "LOCK_LOST"
    refreshed = await stub.Refresh(locks_pb2.RefreshRequest(key="user:alice:3", token=second.token))
    assert refreshed.token == second.token and refreshed.owner == "bob"


async def test_ttl_expiry_hands_the_lock_to_the_waiter_with_a_higher_token(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    recoveries = REGISTRY.get_sample_value("serentak_lock_stale_recoveries_total") or 0.0
    first = await stub.Acquire(acquire("user:alice:4", "sleepy", ttl=2))
    started = time.monotonic()
    # Nobody refreshes the first holder's lease: it expires after its TTL.
    second = await stub.Acquire(acquire("user:alice:4", "next", ttl=10, wait_ms=15_000))
    waited = time.monotonic() - started
    assert second.token > first.token and second.owner == "next"
    assert 1.0 <= waited <= 6.0  # about one TTL (etcd checks expiry every ~500 ms)
    assert REGISTRY.get_sample_value("serentak_lock_stale_recoveries_total") == recoveries + 1
    stale = await stub.Release(locks_pb2.ReleaseRequest(key="user:alice:4", token=first.token))
    assert not stale.released
    state = await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:4"))
    assert state.lock.token == second.token


async def test_waiter_whose_lease_expires_fails_with_lock_lost(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    holder = await stub.Acquire(acquire("user:alice:5", "holder", ttl=30))
    waiting = asyncio.ensure_future(
        stub.Acquire(acquire("user:alice:5", "waiter", ttl=30, wait_ms=20_000))
    )
    state = await wait_for_waiters(stub, "user:alice:5", 1)
    # The waiter's lease vanishes (as if it expired) while it is still queued.
    await lock_service.etcd.revoke_lease(state.waiters[0].lease_id)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(waiting, 10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(caught.value).reason == "LOCK_LOST"
    state = await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:5"))
    assert state.lock.token == holder.token and list(state.waiters) == []


async def test_waiter_keeps_its_short_lease_alive_while_waiting(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    holder = await stub.Acquire(acquire("user:alice:6", "holder", ttl=30))
    waiting = asyncio.ensure_future(
        stub.Acquire(acquire("user:alice:6", "patient", ttl=2, wait_ms=20_000))
    )
    state = await wait_for_waiters(stub, "user:alice:6", 1)
    lease = state.waiters[0].lease_id
    # Wait well past the waiter's 2 s TTL; its lease must still be there.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        assert await lock_service.etcd.lease_remaining(lease) > 0
        await asyncio.sleep(0.2)
    await stub.Release(locks_pb2.ReleaseRequest(key="user:alice:6", token=holder.token))
    got = await asyncio.wait_for(waiting, 10)
    assert got.owner == "patient" and got.token > holder.token and got.lease_id == lease


async def test_describe_and_list_show_holders_and_waiters(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    a = await stub.Acquire(acquire("user:alice:10", "a"))
    await stub.Acquire(acquire("user:alice:inbox", "b"))
    waiter = asyncio.ensure_future(stub.Acquire(acquire("user:alice:10", "c", wait_ms=20_000)))
    await wait_for_waiters(stub, "user:alice:10", 1)
    listed = await stub.List(locks_pb2.ListRequest(prefix=""))
    assert [s.lock.key for s in listed.locks] == ["user:alice:10", "user:alice:inbox"]
    assert [w.owner for w in listed.locks[0].waiters] == ["c"]
    only_tens = await stub.List(locks_pb2.ListRequest(prefix="user:alice:1"))
    assert [s.lock.owner for s in only_tens.locks] == ["a"]
    limited = await stub.List(locks_pb2.ListRequest(prefix="", limit=1))
    assert len(limited.locks) == 1
    await stub.Release(locks_pb2.ReleaseRequest(key="user:alice:10", token=a.token))
    assert (await asyncio.wait_for(waiter, 10)).owner == "c"


async def test_cancelled_acquire_leaves_no_waiter(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    await stub.Acquire(acquire("user:alice:11", "holder", ttl=30))
    call = stub.Acquire(acquire("user:alice:11", "quitter", ttl=30, wait_ms=20_000))
    await wait_for_waiters(stub, "user:alice:11", 1)
    call.cancel()
    await wait_for_waiters(stub, "user:alice:11", 0)


BAD_REQUESTS = [
    ("Acquire", locks_pb2.AcquireRequest(key="", owner="o", ttl_seconds=10), "key"),
    ("Acquire", locks_pb2.AcquireRequest(key="user:alice:a/b", owner="o", ttl_seconds=10), "key"),
    ("Acquire", locks_pb2.AcquireRequest(key="disk:1", owner="o", ttl_seconds=10), "key"),
    (
        "Acquire",
        locks_pb2.AcquireRequest(key="user:alice:" + "9" * 300, owner="o", ttl_seconds=10),
        "key",
    ),
    ("Acquire", locks_pb2.AcquireRequest(key="user:alice:1", owner="", ttl_seconds=10), "owner"),
    (
        "Acquire",
        locks_pb2.AcquireRequest(key="user:alice:1", owner="o", ttl_seconds=1),
        "ttl_seconds",
    ),
    (
        "Acquire",
        locks_pb2.AcquireRequest(key="user:alice:1", owner="o", ttl_seconds=3601),
        "ttl_seconds",
    ),
    (
        "Acquire",
        locks_pb2.AcquireRequest(key="user:alice:1", owner="o", ttl_seconds=10, wait_timeout_ms=-1),
        "wait_timeout_ms",
    ),
    ("Refresh", locks_pb2.RefreshRequest(key="user:alice:1", token=0), "token"),
    ("Refresh", locks_pb2.RefreshRequest(key="nope", token=5), "key"),
    ("Release", locks_pb2.ReleaseRequest(key="user:alice:1", token=-1), "token"),
    ("Release", locks_pb2.ReleaseRequest(key="user:x", token=5), "key"),
    ("Describe", locks_pb2.DescribeRequest(key="user:alice:*"), "key"),
    ("List", locks_pb2.ListRequest(prefix="user:alice:/"), "prefix"),
    ("List", locks_pb2.ListRequest(prefix="", limit=-1), "limit"),
]


@pytest.mark.parametrize(("method", "request_msg", "field"), BAD_REQUESTS)
async def test_bad_input_is_invalid_argument_naming_the_field(
    lock_service, method, request_msg, field
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(lock_service.stub, method)(request_msg)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["field"] == field


async def test_hold_with_bad_key_is_invalid_argument(lock_service) -> None:  # type: ignore[no-untyped-def]
    call = lock_service.stub.Hold(iter([locks_pb2.HoldRequest(key="bad", token=1)]))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["field"] == "key"
