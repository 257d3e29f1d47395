"""The lock service's trust boundary: principals, tenant key spaces, caps, pagination.

Real etcd, the service in-process; calls carry dev-mode bearer credentials.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest
from locks.isolated_service import locks_service
from locks.lock_assertions import wait_for_waiters
from locks.principals import (
    OTHER_TENANT_TOKEN,
    SAME_TENANT_TOKEN,
    SERVICE_TOKEN,
    USER_TOKEN,
    bearer,
)
from serentak.locks.v1 import locks_pb2
from serentak.sdk.locks import LockClient
from support.grpc_errors import error_info

from services.locks.etcd_client import Etcd
from services.locks.keys import KeySpace

pytestmark = pytest.mark.etcd

ALICE, BOB, MALLORY, SERVICE = (
    bearer(USER_TOKEN),
    bearer(SAME_TENANT_TOKEN),
    bearer(OTHER_TENANT_TOKEN),
    bearer(SERVICE_TOKEN),
)


def acquire(
    key: str, ttl: int = 30, wait_ms: int = 0, tenant: str = ""
) -> locks_pb2.AcquireRequest:
    return locks_pb2.AcquireRequest(
        key=key, owner="o", ttl_seconds=ttl, wait_timeout_ms=wait_ms, tenant_id=tenant
    )


async def expect(call, code: grpc.StatusCode, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == code, caught.value.details()
    assert error_info(caught.value).reason == reason


async def first_answer(call, request):  # type: ignore[no-untyped-def]
    """Send `request` on a bidi `call` and read its first answer. A call the server
    refused at once may already be closed when the request goes out: that write fails
    with the client's own error ("Internal error from Core"), and the read then raises
    the status the server sent, which is what the caller checks."""
    try:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call.write(request)
        return await call.read()
    finally:
        call.cancel()


async def hold_first_event(stub, request: locks_pb2.HoldRequest, metadata=()):  # type: ignore[no-untyped-def]
    return await first_answer(stub.Hold(metadata=metadata), request)


async def session_first_answer(stub, request: locks_pb2.SessionRequest, metadata=()):  # type: ignore[no-untyped-def]
    return await first_answer(stub.Session(metadata=metadata), request)


async def test_anonymous_and_unknown_callers_are_refused_on_every_rpc(etcd) -> None:  # type: ignore[no-untyped-def]
    methods = locks_pb2.DESCRIPTOR.services_by_name["LockService"].methods_by_name
    assert set(methods) == {"Acquire", "Refresh", "Release", "Describe", "List", "Hold", "Session"}
    async with locks_service(etcd) as (stub, _, _):
        held = await stub.Acquire(acquire("file:a1"), metadata=ALICE)
        for metadata, reason in (
            ((), "MISSING_CREDENTIALS"),
            (bearer("forged"), "INVALID_CREDENTIALS"),
        ):
            calls = [
                stub.Acquire(acquire("file:a2"), metadata=metadata),
                stub.Refresh(
                    locks_pb2.RefreshRequest(key="file:a1", token=held.token), metadata=metadata
                ),
                stub.Release(
                    locks_pb2.ReleaseRequest(key="file:a1", token=held.token), metadata=metadata
                ),
                stub.Describe(locks_pb2.DescribeRequest(key="file:a1"), metadata=metadata),
                stub.List(locks_pb2.ListRequest(), metadata=metadata),
                hold_first_event(
                    stub, locks_pb2.HoldRequest(key="file:a1", token=held.token), metadata
                ),
                session_first_answer(
                    stub, locks_pb2.SessionRequest(id=1, acquire=acquire("file:a2")), metadata
                ),
            ]
            for call in calls:
                await expect(call, grpc.StatusCode.UNAUTHENTICATED, reason)
        # Nothing of the above touched the lock.
        state = await stub.Describe(locks_pb2.DescribeRequest(key="file:a1"), metadata=ALICE)
        assert state.held and state.lock.token == held.token


async def test_another_tenants_lock_is_invisible_and_untouchable(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        held = await stub.Acquire(acquire("file:secret"), metadata=ALICE)
        # Same tenant: bob sees it.
        seen = await stub.Describe(locks_pb2.DescribeRequest(key="file:secret"), metadata=BOB)
        assert seen.held and seen.lock.token == held.token

        # Another tenant, in its own key space: the key is simply not held there.
        desc = await stub.Describe(locks_pb2.DescribeRequest(key="file:secret"), metadata=MALLORY)
        assert not desc.held and not desc.HasField("lock")
        listed = await stub.List(locks_pb2.ListRequest(), metadata=MALLORY)
        assert list(listed.locks) == [] and listed.next_page_token == ""
        released = await stub.Release(
            locks_pb2.ReleaseRequest(key="file:secret", token=held.token), metadata=MALLORY
        )
        assert not released.released
        await expect(
            stub.Refresh(
                locks_pb2.RefreshRequest(key="file:secret", token=held.token), metadata=MALLORY
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "LOCK_LOST",
        )
        event = await hold_first_event(
            stub, locks_pb2.HoldRequest(key="file:secret", token=held.token), MALLORY
        )
        assert event.lost.reason == locks_pb2.LOST_REASON_NOT_HOLDER

        # Naming alice's tenant explicitly: NOT_FOUND on every RPC.
        acme = "acme"
        for call in (
            stub.Acquire(acquire("file:secret", tenant=acme), metadata=MALLORY),
            stub.Describe(
                locks_pb2.DescribeRequest(key="file:secret", tenant_id=acme), metadata=MALLORY
            ),
            stub.List(locks_pb2.ListRequest(tenant_id=acme), metadata=MALLORY),
            stub.Release(
                locks_pb2.ReleaseRequest(key="file:secret", token=held.token, tenant_id=acme),
                metadata=MALLORY,
            ),
            stub.Refresh(
                locks_pb2.RefreshRequest(key="file:secret", token=held.token, tenant_id=acme),
                metadata=MALLORY,
            ),
            hold_first_event(
                stub,
                locks_pb2.HoldRequest(key="file:secret", token=held.token, tenant_id=acme),
                MALLORY,
            ),
        ):
            await expect(call, grpc.StatusCode.NOT_FOUND, "LOCK_NOT_FOUND")

        # Mallory's own lock of the same name is a different lock; alice's is untouched.
        hers = await stub.Acquire(acquire("file:secret"), metadata=MALLORY)
        assert hers.token != held.token
        state = await stub.Describe(locks_pb2.DescribeRequest(key="file:secret"), metadata=ALICE)
        assert state.held and state.lock.token == held.token


async def test_service_principal_locks_file_keys_of_any_tenant(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        acme = await stub.Acquire(acquire("file:f1", tenant="acme"), metadata=SERVICE)
        evil = await stub.Acquire(acquire("file:f1", tenant="evil"), metadata=SERVICE)
        assert acme.token != evil.token
        for metadata, token in ((ALICE, acme.token), (MALLORY, evil.token)):
            state = await stub.Describe(locks_pb2.DescribeRequest(key="file:f1"), metadata=metadata)
            assert state.held and state.lock.token == token
        # alice's own user: lock is not the service's business, nor in its listing.
        await stub.Acquire(acquire("user:alice:inbox"), metadata=ALICE)
        await expect(
            stub.Acquire(acquire("user:alice:inbox", tenant="acme"), metadata=SERVICE),
            grpc.StatusCode.PERMISSION_DENIED,
            "SERVICE_KEY_FORBIDDEN",
        )
        listed = await stub.List(locks_pb2.ListRequest(tenant_id="acme"), metadata=SERVICE)
        assert [s.lock.key for s in listed.locks] == ["file:f1"]
        await expect(
            stub.List(locks_pb2.ListRequest(prefix="user:", tenant_id="acme"), metadata=SERVICE),
            grpc.StatusCode.PERMISSION_DENIED,
            "SERVICE_KEY_FORBIDDEN",
        )
        # Only the allowed service principals (upload, ops) use locks at all.
        await expect(
            stub.Acquire(acquire("file:f3", tenant="acme"), metadata=bearer("dev-service-notify")),
            grpc.StatusCode.PERMISSION_DENIED,
            "SERVICE_NOT_ALLOWED",
        )
        ops = await stub.Acquire(acquire("file:f3", tenant="acme"), metadata=bearer("dev-ops"))
        assert ops.token > 0
        # A service must say which tenant; the tenant id must be one.
        await expect(
            stub.Acquire(acquire("file:f2"), metadata=SERVICE),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Acquire(acquire("file:f2", tenant="../acme"), metadata=SERVICE)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).metadata["field"] == "tenant_id"
        # Release needs the same tenant as well as the token.
        wrong = await stub.Release(
            locks_pb2.ReleaseRequest(key="file:f1", token=acme.token, tenant_id="evil"),
            metadata=SERVICE,
        )
        assert not wrong.released
        right = await stub.Release(
            locks_pb2.ReleaseRequest(key="file:f1", token=acme.token, tenant_id="acme"),
            metadata=SERVICE,
        )
        assert right.released


async def test_lock_client_as_service_holds_a_tenants_file_lock(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, channel):
        client = LockClient(channel, owner="merge", token=SERVICE_TOKEN)
        async with client.hold("file:m1", ttl=5, tenant_id="acme") as lock:
            state = await stub.Describe(locks_pb2.DescribeRequest(key="file:m1"), metadata=ALICE)
            assert state.held and state.lock.token == lock.token
            assert state.lock.owner == "merge"
        state = await stub.Describe(locks_pb2.DescribeRequest(key="file:m1"), metadata=ALICE)
        assert not state.held


async def test_caps_on_held_locks_and_waiters_per_tenant(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd, lock_max_held_per_tenant=2, lock_max_waiters_per_tenant=1) as (
        stub,
        _,
        _,
    ):
        await stub.Acquire(acquire("file:c1"), metadata=ALICE)
        await stub.Acquire(acquire("file:c2"), metadata=BOB)  # same tenant, same budget
        await expect(
            stub.Acquire(acquire("file:c3"), metadata=ALICE),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_LOCK_LIMIT",
        )
        # Another tenant has its own budget; services are not capped.
        await stub.Acquire(acquire("file:c3"), metadata=MALLORY)
        await stub.Acquire(acquire("file:c3", tenant="acme"), metadata=SERVICE)
        # One waiter may queue; the second is refused at once, leaving no key behind.
        waiting = asyncio.ensure_future(
            stub.Acquire(acquire("file:c1", wait_ms=20_000), metadata=BOB)
        )
        await wait_for_waiters(stub, "file:c1", 1, metadata=ALICE)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Acquire(acquire("file:c2", wait_ms=20_000), metadata=ALICE)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info(caught.value)
        assert info.reason == "TENANT_WAITER_LIMIT" and info.metadata["limit"] == "1"
        state = await stub.Describe(locks_pb2.DescribeRequest(key="file:c2"), metadata=ALICE)
        assert list(state.waiters) == []
        waiting.cancel()


async def test_lock_cap_holds_when_many_acquires_race(etcd) -> None:  # type: ignore[no-untyped-def]
    cap = 3
    async with locks_service(etcd, lock_max_held_per_tenant=cap) as (stub, prefix, _):
        results = await asyncio.gather(
            *(stub.Acquire(acquire(f"file:r{i}"), metadata=ALICE) for i in range(12)),
            return_exceptions=True,
        )
        won = [r for r in results if isinstance(r, locks_pb2.Lock)]
        refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        assert len(won) == cap and len(refused) == 12 - cap
        assert {r.code() for r in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        # etcd holds exactly the winners' keys: every refused contender removed its own.
        etcd_client = Etcd(etcd.endpoint, call_timeout=5)
        try:
            keys = await etcd_client.by_create_revision(KeySpace(prefix).tenant_root("acme"))
        finally:
            await etcd_client.close()
        assert sorted(kv.create_revision for kv in keys) == sorted(w.token for w in won)


async def test_list_is_paginated_with_an_opaque_token(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        names = ["file:p1", "file:p2", "file:p3", "file:p4", "file:p5", "user:alice:x"]
        for name in names:
            await stub.Acquire(acquire(name), metadata=ALICE)
        seen, token, pages = [], "", 0
        while True:
            page = await stub.List(
                locks_pb2.ListRequest(prefix="file:", page_size=2, page_token=token),
                metadata=ALICE,
            )
            pages += 1
            seen += [s.lock.key for s in page.locks]
            token = page.next_page_token
            if not token:
                break
        assert seen == names[:5] and pages == 3
        everything = await stub.List(locks_pb2.ListRequest(page_size=100), metadata=ALICE)
        assert [s.lock.key for s in everything.locks] == names
        assert everything.next_page_token == ""

        first = await stub.List(locks_pb2.ListRequest(page_size=2), metadata=ALICE)
        # Another tenant replaying the token lists only its own (empty) space.
        replay = await stub.List(
            locks_pb2.ListRequest(page_size=2, page_token=first.next_page_token),
            metadata=MALLORY,
        )
        assert list(replay.locks) == []
        bad = [
            (locks_pb2.ListRequest(page_token="not-a-token"), "page_token"),
            (locks_pb2.ListRequest(prefix="user:", page_token=first.next_page_token), "page_token"),
            (locks_pb2.ListRequest(page_size=-1), "page_size"),
        ]
        for request, field in bad:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.List(request, metadata=ALICE)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_info(caught.value).metadata["field"] == field
