"""Lock keys bound to authority (issue 33, `services/locks/tenancy.py`): `file:` keys are
the merge's and the operators', a user's keys are its own `user:{self}:` space, a lock is
released, refreshed and held only by the principal that acquired it, and who holds it is
shown only to that principal and to operators, never in a refusal.

Real etcd, the service in-process; calls carry dev-mode (or JWT) bearer credentials.
"""

from __future__ import annotations

import asyncio
import re
import uuid

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from locks.isolated_service import locks_service
from locks.lock_assertions import (
    expect,
    hold_first_event,
    session_first_answer,
    wait_for_waiters,
)
from locks.principals import OPS_TOKEN, SAME_TENANT_TOKEN, SERVICE_TOKEN, USER_TOKEN, bearer
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from support.jwks import JwksServer, SigningKey, claims, jwt_settings
from support.services import running_app

from services.locks.app import build_app
from services.locks.errors import LockLost
from services.locks.etcd_client import Etcd
from services.locks.keys import KeySpace
from services.locks.lease_pool import LeasePool
from services.locks.lock_views import Caller
from services.locks.mutex import Mutex
from services.locks.reaper import LeaseReaper
from services.locks.settings import LocksSettings

pytestmark = pytest.mark.etcd

ALICE, BOB, CAROL = bearer(USER_TOKEN), bearer(SAME_TENANT_TOKEN), bearer("dev-carol")
MERGE, OPS = bearer(SERVICE_TOKEN), bearer(OPS_TOKEN)
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED


def acquire(key: str, owner: str = "o", wait_ms: int = 0, tenant: str = "", ttl: int = 30):  # type: ignore[no-untyped-def]
    return locks_pb2.AcquireRequest(
        key=key, owner=owner, ttl_seconds=ttl, wait_timeout_ms=wait_ms, tenant_id=tenant
    )


def every_rpc_naming(stub, key: str, token: int, metadata):  # type: ignore[no-untyped-def]
    """One call of each RPC (and a Session request) naming `key`, as `metadata`'s caller."""
    return [
        stub.Acquire(acquire(key), metadata=metadata),
        stub.Refresh(locks_pb2.RefreshRequest(key=key, token=token), metadata=metadata),
        stub.Release(locks_pb2.ReleaseRequest(key=key, token=token), metadata=metadata),
        stub.Describe(locks_pb2.DescribeRequest(key=key), metadata=metadata),
        hold_first_event(stub, locks_pb2.HoldRequest(key=key, token=token), metadata),
    ]


def refusal_details(exc: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
    """Everything a refused call tells its caller: message, ErrorInfo metadata, and every
    other rich-status detail, flattened to text."""
    texts = [exc.details() or ""]
    metadata: dict[str, str] = {}
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            metadata.update(info.metadata)
        else:
            texts.append(str(detail))
    return "\n".join(texts), metadata


def assert_no_token(text: str, metadata: dict[str, str], *tokens: int) -> None:
    # `token` may echo the caller's own; nothing may carry the holder's or a waiter's.
    assert not [k for k in metadata if "token" in k and k != "token"], metadata
    for token in tokens:
        assert str(token) not in metadata.values(), metadata
        assert not re.search(rf"\b{token}\b", text), text


async def test_a_user_may_not_name_a_file_key_on_any_rpc(etcd) -> None:  # type: ignore[no-untyped-def]
    """carol, with no role on the file, cannot stall its merge by taking its lock."""
    file_key = f"file:{uuid.uuid4().hex[:12]}"
    async with locks_service(etcd) as (stub, _, _):
        merge = await stub.Acquire(acquire(file_key, "merge", tenant="acme"), metadata=MERGE)
        released = locks_pb2.ReleaseRequest(key=file_key, token=merge.token, tenant_id="acme")
        assert (await stub.Release(released, metadata=MERGE)).released
        # The lock is free: still carol may not take it, nor touch it in any other way.
        for call in every_rpc_naming(stub, file_key, merge.token, CAROL):
            await expect(call, PERMISSION_DENIED, "FILE_KEY_FORBIDDEN")
        session = await session_first_answer(
            stub, locks_pb2.SessionRequest(id=1, acquire=acquire(file_key)), CAROL
        )
        assert (session.error.code, session.error.reason) == (
            PERMISSION_DENIED.value[0],
            "FILE_KEY_FORBIDDEN",
        )
        await expect(
            stub.List(locks_pb2.ListRequest(prefix="file:"), metadata=CAROL),
            PERMISSION_DENIED,
            "FILE_KEY_FORBIDDEN",
        )
        # The merge, and the operator, still take it at once: nothing of carol's is left.
        again = await stub.Acquire(acquire(file_key, "merge", tenant="acme"), metadata=MERGE)
        assert again.token > merge.token
        state = await stub.Describe(
            locks_pb2.DescribeRequest(key=file_key, tenant_id="acme"), metadata=OPS
        )
        assert state.held and state.lock.token == again.token and list(state.waiters) == []


async def test_a_user_may_not_name_another_users_space(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        bobs = await stub.Acquire(acquire("user:bob:notifications", "bob"), metadata=BOB)
        for call in every_rpc_naming(stub, "user:bob:notifications", bobs.token, ALICE):
            await expect(call, PERMISSION_DENIED, "USER_KEY_FORBIDDEN")
        # `user:bob` is a prefix of `user:bobby:`: the space ends at its colon.
        await stub.Acquire(acquire("user:alice:x"), metadata=ALICE)
        for prefix in ("user:bob", "user:bob:", "user:b"):
            await expect(
                stub.List(locks_pb2.ListRequest(prefix=prefix), metadata=ALICE),
                PERMISSION_DENIED,
                "USER_KEY_FORBIDDEN",
            )
        # Her own List sees her own space only, whatever prefix reaches it.
        for prefix in ("", "user:", "user:alice", "user:alice:"):
            listed = await stub.List(locks_pb2.ListRequest(prefix=prefix), metadata=ALICE)
            assert [s.lock.key for s in listed.locks] == ["user:alice:x"], prefix
        state = await stub.Describe(
            locks_pb2.DescribeRequest(key="user:bob:notifications"), metadata=BOB
        )
        assert state.held and state.lock.token == bobs.token


async def test_only_the_acquiring_principal_releases_refreshes_or_holds(etcd) -> None:  # type: ignore[no-untyped-def]
    """The merge's token in the operator's hands (and the reverse) frees nothing, on the
    replica that granted it (its remembered fast path) and on another one."""
    async with locks_service(etcd) as (stub, prefix, _):
        settings = LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=prefix)
        async with running_app(build_app(settings)) as other:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{other.app.bound_port}") as ch:
                replicas = (stub, locks_pb2_grpc.LockServiceStub(ch))
                for holder, intruder in ((MERGE, OPS), (OPS, MERGE)):
                    key = f"file:{uuid.uuid4().hex[:12]}"
                    held = await stub.Acquire(acquire(key, tenant="acme"), metadata=holder)
                    for replica in replicas:
                        release = locks_pb2.ReleaseRequest(
                            key=key, token=held.token, tenant_id="acme"
                        )
                        assert not (await replica.Release(release, metadata=intruder)).released
                        await expect(
                            replica.Refresh(
                                locks_pb2.RefreshRequest(
                                    key=key, token=held.token, tenant_id="acme"
                                ),
                                metadata=intruder,
                            ),
                            grpc.StatusCode.FAILED_PRECONDITION,
                            "LOCK_LOST",
                        )
                        event = await hold_first_event(
                            replica,
                            locks_pb2.HoldRequest(key=key, token=held.token, tenant_id="acme"),
                            intruder,
                        )
                        assert event.lost.reason == locks_pb2.LOST_REASON_NOT_HOLDER
                    described = locks_pb2.DescribeRequest(key=key, tenant_id="acme")
                    state = await stub.Describe(described, metadata=holder)
                    assert state.held and state.lock.token == held.token
                    # Its own principal, with the same token, still may.
                    release = locks_pb2.ReleaseRequest(key=key, token=held.token, tenant_id="acme")
                    assert (await stub.Release(release, metadata=holder)).released


async def test_the_mutex_binds_a_lock_to_its_principal(etcd) -> None:  # type: ignore[no-untyped-def]
    """Below the key-space rules: bob's Release, Refresh and Hold with alice's token, on
    alice's lock, change nothing."""
    client = Etcd(etcd.endpoint, call_timeout=5)
    m = Mutex(client, KeySpace(f"/t/{uuid.uuid4().hex}/"), LeaseReaper(client), LeasePool(client))
    alice, bob = Caller("user:alice"), Caller("user:bob")
    try:
        key = m.keys.lock_key("user:alice:doc", "acme")
        held = await m.acquire(key, "alice", 30, 0, "cid", caller=alice)
        assert held.principal == "user:alice"
        assert not await m.release(key, held.token, bob)
        with pytest.raises(LockLost) as lost:
            await m.refresh(key, held.token, bob)
        assert "holder_token" not in lost.value.metadata
        assert (await m.describe(key)).holder.token == held.token  # type: ignore[union-attr]
        assert await m.release(key, held.token, alice)
    finally:
        await m.leases.close()
        await client.close()


async def test_no_lock_held_refusal_carries_a_token(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        key = f"file:{uuid.uuid4().hex[:12]}"
        held = await stub.Acquire(acquire(key, "repair-7", tenant="acme"), metadata=OPS)
        waiter = asyncio.ensure_future(
            stub.Acquire(acquire(key, "repair-8", wait_ms=20_000, tenant="acme"), metadata=OPS)
        )
        state = await wait_for_waiters(stub, key, 1, metadata=OPS, tenant="acme")
        queued = state.waiters[0].create_revision  # the waiter's future token
        # Another principal (the merge: not told who holds it either) and the holder's
        # own principal (told its owner): neither is given a token.
        for caller, owner_shown in ((MERGE, False), (OPS, True)):
            for wait_ms in (0, 200):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Acquire(
                        acquire(key, "late", wait_ms=wait_ms, tenant="acme"), metadata=caller
                    )
                assert caught.value.code() == grpc.StatusCode.ABORTED
                text, metadata = refusal_details(caught.value)
                assert_no_token(text, metadata, held.token, queued)
                assert ("holder_owner" in metadata) is owner_shown
                assert metadata["holder_expires_at"].endswith("Z")
        # On a Session stream the refusal is the same error.
        answer = await session_first_answer(
            stub,
            locks_pb2.SessionRequest(id=1, acquire=acquire(key, "late", tenant="acme")),
            MERGE,
        )
        assert "holder_owner" not in answer.error.metadata
        assert answer.error.reason == "LOCK_HELD"
        assert_no_token(answer.error.message, dict(answer.error.metadata), held.token, queued)
        # Nor does a refused Refresh name the holder's token.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Refresh(
                locks_pb2.RefreshRequest(key=key, token=held.token - 1, tenant_id="acme"),
                metadata=OPS,
            )
        text, metadata = refusal_details(caught.value)
        assert_no_token(text, metadata, held.token)
        waiter.cancel()


async def test_who_holds_a_lock_is_shown_to_its_principal_and_operators_only(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        key = f"file:{uuid.uuid4().hex[:12]}"
        held = await stub.Acquire(acquire(key, "ops-repair", tenant="acme"), metadata=OPS)
        waiting = asyncio.ensure_future(
            stub.Acquire(acquire(key, "merge-1", wait_ms=20_000, tenant="acme"), metadata=MERGE)
        )
        await wait_for_waiters(stub, key, 1, metadata=OPS, tenant="acme")
        described = locks_pb2.DescribeRequest(key=key, tenant_id="acme")
        # The holder, and the operator (here the same principal), see everything.
        mine = await stub.Describe(described, metadata=OPS)
        assert (mine.lock.token, mine.lock.owner, mine.lock.principal) == (
            held.token,
            "ops-repair",
            "service:ops",
        )
        assert mine.lock.lease_id and mine.lock.correlation_id
        assert [(w.owner, w.principal) for w in mine.waiters] == [("merge-1", "service:upload")]
        queued = mine.waiters[0].create_revision
        # The merge sees that the lock is held, until when, and its own waiter; not who
        # holds it, nor the holder's token.
        theirs = await stub.Describe(described, metadata=MERGE)
        assert theirs.held and theirs.lock.key == key
        assert theirs.lock.expires_at.ToSeconds() > 0
        assert (theirs.lock.token, theirs.lock.owner, theirs.lock.lease_id) == (0, "", 0)
        assert (theirs.lock.correlation_id, theirs.lock.principal) == ("", "")
        assert [(w.owner, w.create_revision) for w in theirs.waiters] == [("merge-1", queued)]
        listed = await stub.List(locks_pb2.ListRequest(tenant_id="acme"), metadata=MERGE)
        assert [(s.lock.key, s.lock.token, s.lock.owner) for s in listed.locks] == [(key, 0, "")]
        waiting.cancel()

        # A user of the tenant holding the ops role is an operator too: it sees bob's
        # holder, and takes file: keys, but still changes nothing in bob's space.
        signing = SigningKey()
        jwks = JwksServer(signing)
        try:
            async with locks_service(etcd, **jwt_settings(jwks)) as (jwt_stub, _, _):
                operator = bearer(signing.sign(claims(sub="olga", roles=["ops"])))
                plain = bearer(signing.sign(claims(sub="alice")))
                jwt_bobs = await jwt_stub.Acquire(
                    acquire("user:bob:report", "bob-laptop"),
                    metadata=bearer(signing.sign(claims(sub="bob"))),
                )
                seen = await jwt_stub.Describe(
                    locks_pb2.DescribeRequest(key="user:bob:report"), metadata=operator
                )
                assert (seen.lock.token, seen.lock.principal) == (jwt_bobs.token, "user:bob")
                await expect(
                    jwt_stub.Release(
                        locks_pb2.ReleaseRequest(key="user:bob:report", token=jwt_bobs.token),
                        metadata=operator,
                    ),
                    PERMISSION_DENIED,
                    "USER_KEY_FORBIDDEN",
                )
                olgas = await jwt_stub.Acquire(acquire("file:f9"), metadata=operator)
                assert olgas.principal == "user:olga"
                await expect(
                    jwt_stub.Acquire(acquire("file:f9"), metadata=plain),
                    PERMISSION_DENIED,
                    "FILE_KEY_FORBIDDEN",
                )
        finally:
            jwks.close()
