"""Release on the replica that granted the token (one etcd transaction, no holder read)
and on any other replica (the holder read first): both delete only the holder's key."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from locks.lock_assertions import wait_for_waiters
from locks.principals import OTHER_TENANT_TOKEN, SERVICE_TOKEN, USER_TOKEN, bearer
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from support.bearer import bearer_channel
from support.services import running_app

from services.locks.app import build_app
from services.locks.settings import LocksSettings

pytestmark = pytest.mark.etcd


def acquire(key: str, owner: str, wait_ms: int = 0) -> locks_pb2.AcquireRequest:
    return locks_pb2.AcquireRequest(key=key, owner=owner, ttl_seconds=20, wait_timeout_ms=wait_ms)


async def test_release_on_either_replica_deletes_only_the_holders_key(etcd, lock_service) -> None:  # type: ignore[no-untyped-def]
    a = lock_service.stub
    settings = LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=lock_service.prefix)
    async with running_app(build_app(settings)) as other:
        async with bearer_channel(f"127.0.0.1:{other.app.bound_port}", USER_TOKEN) as channel:
            b = locks_pb2_grpc.LockServiceStub(channel)
            # Granted by A, released through B (B never saw the token).
            first = await a.Acquire(acquire("user:alice:r1", "alice"))
            assert (
                await b.Release(locks_pb2.ReleaseRequest(key="user:alice:r1", token=first.token))
            ).released
            # A still remembers the token: its fast path must find the key gone, and must
            # not touch the next holder's key.
            second = await b.Acquire(acquire("user:alice:r1", "bob"))
            assert not (
                await a.Release(locks_pb2.ReleaseRequest(key="user:alice:r1", token=first.token))
            ).released
            state = await a.Describe(locks_pb2.DescribeRequest(key="user:alice:r1"))
            assert state.held and state.lock.token == second.token

            # A waiter's revision is no holder's token on either replica.
            waiting = asyncio.ensure_future(
                a.Acquire(acquire("user:alice:r1", "carol", wait_ms=20_000))
            )
            state = await wait_for_waiters(a, "user:alice:r1", 1)
            waiter_revision = state.waiters[0].create_revision
            for stub in (a, b):
                resp = await stub.Release(
                    locks_pb2.ReleaseRequest(key="user:alice:r1", token=waiter_revision)
                )
                assert not resp.released
            await wait_for_waiters(a, "user:alice:r1", 1)  # the waiter is still queued
            # The holder's release hands the lock to the waiter, whose token A remembers.
            assert (
                await a.Release(locks_pb2.ReleaseRequest(key="user:alice:r1", token=second.token))
            ).released
            third = await waiting
            assert third.token == waiter_revision > second.token
            assert (
                await a.Release(locks_pb2.ReleaseRequest(key="user:alice:r1", token=third.token))
            ).released
            assert not (await b.Describe(locks_pb2.DescribeRequest(key="user:alice:r1"))).held


async def test_release_in_another_tenant_with_a_remembered_token_is_refused(lock_service) -> None:  # type: ignore[no-untyped-def]
    # The merge principal acts in any tenant: the same key and token named in another
    # tenant is another lock, even on the replica that remembers the token.
    merge = bearer(SERVICE_TOKEN)
    key = f"file:{uuid.uuid4().hex[:8]}"
    mine = await lock_service.stub.Acquire(
        locks_pb2.AcquireRequest(key=key, owner="merge", ttl_seconds=20, tenant_id="acme"),
        metadata=merge,
    )
    elsewhere = locks_pb2.ReleaseRequest(key=key, token=mine.token, tenant_id="evil")
    assert not (await lock_service.stub.Release(elsewhere, metadata=merge)).released
    # A user of another tenant cannot even name alice's space.
    async with bearer_channel(lock_service.address, OTHER_TENANT_TOKEN) as channel:
        intruder = locks_pb2_grpc.LockServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await intruder.Release(locks_pb2.ReleaseRequest(key="user:alice:x", token=mine.token))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    state = await lock_service.stub.Describe(
        locks_pb2.DescribeRequest(key=key, tenant_id="acme"), metadata=merge
    )
    assert state.held and state.lock.token == mine.token
