"""The lock service's trust boundary: principals, tenant key spaces, caps, pagination.

Real etcd, the service in-process; calls carry dev-mode bearer credentials.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from locks.isolated_service import locks_service
from locks.lock_assertions import (
    expect,
    hold_first_event,
    session_first_answer,
    wait_for_waiters,
)
from locks.principals import (
    OPS_TOKEN,
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

ALICE, BOB, MALLORY, SERVICE, OPS = (
    bearer(USER_TOKEN),
    bearer(SAME_TENANT_TOKEN),
    bearer(OTHER_TENANT_TOKEN),
    bearer(SERVICE_TOKEN),
    bearer(OPS_TOKEN),
)


def acquire(
    key: str, ttl: int = 30, wait_ms: int = 0, tenant: str = ""
) -> locks_pb2.AcquireRequest:
    return locks_pb2.AcquireRequest(
        key=key, owner="o", ttl_seconds=ttl, wait_timeout_ms=wait_ms, tenant_id=tenant
    )


async def test_anonymous_and_unknown_callers_are_refused_on_every_rpc(etcd) -> None:  # type: ignore[no-untyped-def]
    methods = locks_pb2.DESCRIPTOR.services_by_name["LockService"].methods_by_name
    assert set(methods) == {"Acquire", "Refresh", "Release", "Describe", "List", "Hold", "Session"}
    async with locks_service(etcd) as (stub, _, _):
        held = await stub.Acquire(acquire("user:alice:a1"), metadata=ALICE)
        for metadata, reason in (
            ((), "MISSING_CREDENTIALS"),
            (bearer("forged"), "INVALID_CREDENTIALS"),
        ):
            calls = [
                stub.Acquire(acquire("user:alice:a2"), metadata=metadata),
                stub.Refresh(
                    locks_pb2.RefreshRequest(key="user:alice:a1", token=held.token),
                    metadata=metadata,
                ),
                stub.Release(
                    locks_pb2.ReleaseRequest(key="user:alice:a1", token=held.token),
                    metadata=metadata,
                ),
                stub.Describe(locks_pb2.DescribeRequest(key="user:alice:a1"), metadata=metadata),
                stub.List(locks_pb2.ListRequest(), metadata=metadata),
                hold_first_event(
                    stub, locks_pb2.HoldRequest(key="user:alice:a1", token=held.token), metadata
                ),
                session_first_answer(
                    stub, locks_pb2.SessionRequest(id=1, acquire=acquire("user:alice:a2")), metadata
                ),
            ]
            for call in calls:
                await expect(call, grpc.StatusCode.UNAUTHENTICATED, reason)
        # Nothing of the above touched the lock.
        state = await stub.Describe(locks_pb2.DescribeRequest(key="user:alice:a1"), metadata=ALICE)
        assert state.held and state.lock.token == held.token


async def test_another_tenants_lock_is_invisible_and_untouchable(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        held = await stub.Acquire(acquire("user:alice:secret"), metadata=ALICE)
        # Another tenant's user lists only its own (empty) space.
        listed = await stub.List(locks_pb2.ListRequest(), metadata=MALLORY)
        assert list(listed.locks) == [] and listed.next_page_token == ""

        # Naming alice's tenant explicitly: NOT_FOUND on every RPC, whatever the key.
        acme = "acme"
        for key in ("user:alice:secret", "user:mallory:secret"):
            for call in (
                stub.Acquire(acquire(key, tenant=acme), metadata=MALLORY),
                stub.Describe(locks_pb2.DescribeRequest(key=key, tenant_id=acme), metadata=MALLORY),
                stub.Release(
                    locks_pb2.ReleaseRequest(key=key, token=held.token, tenant_id=acme),
                    metadata=MALLORY,
                ),
                stub.Refresh(
                    locks_pb2.RefreshRequest(key=key, token=held.token, tenant_id=acme),
                    metadata=MALLORY,
                ),
                hold_first_event(
                    stub,
                    locks_pb2.HoldRequest(key=key, token=held.token, tenant_id=acme),
                    MALLORY,
                ),
            ):
                await expect(call, grpc.StatusCode.NOT_FOUND, "LOCK_NOT_FOUND")
        await expect(
            stub.List(locks_pb2.ListRequest(tenant_id=acme), metadata=MALLORY),
            grpc.StatusCode.NOT_FOUND,
            "LOCK_NOT_FOUND",
        )

        # Mallory's own lock lives in her tenant; alice's is untouched.
        hers = await stub.Acquire(acquire("user:mallory:secret"), metadata=MALLORY)
        assert hers.token != held.token
        state = await stub.Describe(
            locks_pb2.DescribeRequest(key="user:alice:secret"), metadata=ALICE
        )
        assert state.held and state.lock.token == held.token


async def test_service_principal_locks_file_keys_of_any_tenant(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        acme = await stub.Acquire(acquire("file:f1", tenant="acme"), metadata=SERVICE)
        evil = await stub.Acquire(acquire("file:f1", tenant="evil"), metadata=SERVICE)
        assert acme.token != evil.token
        for tenant, token in (("acme", acme.token), ("evil", evil.token)):
            state = await stub.Describe(
                locks_pb2.DescribeRequest(key="file:f1", tenant_id=tenant), metadata=SERVICE
            )
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
        described = locks_pb2.DescribeRequest(key="file:m1", tenant_id="acme")
        async with client.hold("file:m1", ttl=5, tenant_id="acme") as lock:
            state = await stub.Describe(described, metadata=OPS)
            assert state.held and state.lock.token == lock.token
            assert (state.lock.owner, state.lock.principal) == ("merge", "service:upload")
        state = await stub.Describe(described, metadata=OPS)
        assert not state.held


async def test_caps_on_held_locks_and_waiters_per_tenant(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd, lock_max_held_per_tenant=2, lock_max_waiters_per_tenant=1) as (
        stub,
        _,
        _,
    ):
        await stub.Acquire(acquire("user:alice:c1"), metadata=ALICE)
        await stub.Acquire(acquire("user:bob:c2"), metadata=BOB)  # same tenant, same budget
        await expect(
            stub.Acquire(acquire("user:alice:c3"), metadata=ALICE),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_LOCK_LIMIT",
        )
        # Another tenant has its own budget; services are not capped.
        await stub.Acquire(acquire("user:mallory:c3"), metadata=MALLORY)
        await stub.Acquire(acquire("file:c3", tenant="acme"), metadata=SERVICE)
        # One waiter may queue; the second is refused at once, leaving no key behind.
        waiting = asyncio.ensure_future(
            stub.Acquire(acquire("user:alice:c1", wait_ms=20_000), metadata=ALICE)
        )
        await wait_for_waiters(stub, "user:alice:c1", 1, metadata=ALICE)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Acquire(acquire("user:bob:c2", wait_ms=20_000), metadata=BOB)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info(caught.value)
        assert info.reason == "TENANT_WAITER_LIMIT" and info.metadata["limit"] == "1"
        state = await stub.Describe(locks_pb2.DescribeRequest(key="user:bob:c2"), metadata=BOB)
        assert list(state.waiters) == []
        waiting.cancel()


async def test_lock_cap_holds_when_many_acquires_race(etcd) -> None:  # type: ignore[no-untyped-def]
    cap = 3
    async with locks_service(etcd, lock_max_held_per_tenant=cap) as (stub, prefix, _):
        results = await asyncio.gather(
            *(stub.Acquire(acquire(f"user:alice:r{i}"), metadata=ALICE) for i in range(12)),
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
        names = [f"user:alice:p{i}" for i in range(1, 6)] + ["user:alice:x"]
        for name in names:
            await stub.Acquire(acquire(name), metadata=ALICE)
        seen, token, pages = [], "", 0
        while True:
            page = await stub.List(
                locks_pb2.ListRequest(prefix="user:alice:p", page_size=2, page_token=token),
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
        # Another user replaying the token: it is bound to alice's space, not hers.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.List(
                locks_pb2.ListRequest(page_size=2, page_token=first.next_page_token),
                metadata=MALLORY,
            )
        assert error_info(caught.value).metadata["field"] == "page_token"
        bad = [
            (locks_pb2.ListRequest(page_token="not-a-token"), "page_token"),
            (
                locks_pb2.ListRequest(prefix="user:alice:p", page_token=first.next_page_token),
                "page_token",
            ),
            (locks_pb2.ListRequest(page_size=-1), "page_size"),
        ]
        for request, field in bad:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.List(request, metadata=ALICE)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_info(caught.value).metadata["field"] == field
