"""The Session stream: lock requests as messages on one stream, with the unary RPCs' rules.

Real etcd, the service in-process; calls carry dev-mode (or JWT) bearer credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from locks.isolated_service import locks_service
from locks.lock_assertions import wait_for_waiters
from locks.principals import OTHER_TENANT_TOKEN, USER_TOKEN, bearer
from prometheus_client import REGISTRY
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from serentak.sdk.locks import LockClient
from support.grpc_errors import error_info
from support.jwks import JwksServer, SigningKey, claims, jwt_settings
from support.services import running_app

from services.locks.app import build_app
from services.locks.session import LockSession
from services.locks.settings import LocksSettings

pytestmark = pytest.mark.etcd

ALICE, MALLORY = bearer(USER_TOKEN), bearer(OTHER_TENANT_TOKEN)
Session = grpc.aio.StreamStreamCall


def acquire(
    request_id: int, key: str, wait_ms: int = 0, tenant: str = ""
) -> locks_pb2.SessionRequest:
    return locks_pb2.SessionRequest(
        id=request_id,
        acquire=locks_pb2.AcquireRequest(
            key=key, owner="o", ttl_seconds=30, wait_timeout_ms=wait_ms, tenant_id=tenant
        ),
    )


def release(request_id: int, key: str, token: int, tenant: str = "") -> locks_pb2.SessionRequest:
    return locks_pb2.SessionRequest(
        id=request_id,
        release=locks_pb2.ReleaseRequest(key=key, token=token, tenant_id=tenant),
    )


async def ask(session: Session, request: locks_pb2.SessionRequest) -> locks_pb2.SessionResponse:
    """Send one request and read the next answer (only one in flight)."""
    await session.write(request)
    answer = await session.read()
    assert answer is not grpc.aio.EOF
    assert answer.id == request.id
    return answer


async def holder(stub: locks_pb2_grpc.LockServiceStub, key: str) -> locks_pb2.DescribeResponse:
    return await stub.Describe(locks_pb2.DescribeRequest(key=key), metadata=ALICE)


async def taken_by_someone(stub: locks_pb2_grpc.LockServiceStub, key: str) -> locks_pb2.Lock:
    """`key` held by another owner of alice's tenant, through a unary Acquire."""
    return await stub.Acquire(
        locks_pb2.AcquireRequest(key=key, owner="x", ttl_seconds=30), metadata=ALICE
    )


async def test_acquire_and_release_on_one_stream_are_the_unary_rpcs_own(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        session = stub.Session(metadata=ALICE)
        tokens = []
        for i in range(3):
            lock = (await ask(session, acquire(10 * i + 1, "user:alice:s1"))).lock
            state = await holder(stub, "user:alice:s1")
            assert state.held and state.lock.token == lock.token and lock.owner == "o"
            answer = await ask(session, release(10 * i + 2, "user:alice:s1", lock.token))
            assert answer.release.released
            assert not (await holder(stub, "user:alice:s1")).held
            tokens.append(lock.token)
        # Fencing tokens grow across the session's locks, as across unary calls.
        assert tokens == sorted(set(tokens))
        session.cancel()


async def test_a_waiting_acquire_does_not_hold_back_a_release_on_the_same_stream(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        session = stub.Session(metadata=ALICE)
        first = (await ask(session, acquire(1, "user:alice:s2"))).lock
        # A second Acquire of the same key waits behind the first lock...
        await session.write(acquire(2, "user:alice:s2", wait_ms=20_000))
        await wait_for_waiters(stub, "user:alice:s2", 1, metadata=ALICE)
        # ...while the Release of the first is answered on the same stream,
        await session.write(release(3, "user:alice:s2", first.token))
        answers = {}
        for _ in range(2):
            answer = await session.read()
            answers[answer.id] = answer
        assert answers[3].release.released
        # and the waiter then holds the lock under a newer token.
        second = answers[2].lock
        assert second.token > first.token
        assert (await holder(stub, "user:alice:s2")).lock.token == second.token
        session.cancel()


def domain_errors(reason: str) -> float:
    return REGISTRY.get_sample_value("serentak_domain_errors_total", {"reason": reason}) or 0.0


async def test_a_failed_request_is_answered_with_its_status_and_the_stream_goes_on(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        taken = await taken_by_someone(stub, "user:alice:s3")
        session = stub.Session(metadata=ALICE)
        cases = [
            (acquire(1, "user:alice:s3"), grpc.StatusCode.ABORTED, "LOCK_HELD"),
            (acquire(2, "no-such-form"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_LOCK_KEY"),
            (locks_pb2.SessionRequest(id=3), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
            (
                locks_pb2.SessionRequest(
                    id=4,
                    refresh=locks_pb2.RefreshRequest(key="user:alice:s3", token=taken.token - 1),
                ),
                grpc.StatusCode.FAILED_PRECONDITION,
                "LOCK_LOST",
            ),
        ]
        for request, code, reason in cases:
            counted = domain_errors(reason)
            error = (await ask(session, request)).error
            assert (error.code, error.reason) == (code.value[0], reason), error
            assert error.message
            # Counted as the unary RPC's error would be.
            assert domain_errors(reason) == counted + 1
        # LOCK_HELD names the holder, as the unary status's ErrorInfo does.
        held = (await ask(session, acquire(5, "user:alice:s3"))).error
        assert held.metadata["holder_owner"] == "x"
        # The stream is still open and serving.
        refreshed = await ask(
            session,
            locks_pb2.SessionRequest(
                id=6, refresh=locks_pb2.RefreshRequest(key="user:alice:s3", token=taken.token)
            ),
        )
        assert refreshed.lock.token == taken.token
        session.cancel()


async def test_anonymous_and_forged_callers_are_refused_before_any_request_runs(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        for metadata, reason in (
            ((), "MISSING_CREDENTIALS"),
            (bearer("forged"), "INVALID_CREDENTIALS"),
        ):
            session = stub.Session(metadata=metadata)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await session.write(acquire(1, "user:alice:s4"))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await session.read()
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_info(caught.value).reason == reason
        assert not (await holder(stub, "user:alice:s4")).held


async def test_another_tenant_cannot_reach_a_lock_through_a_session(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        held = await stub.Acquire(
            locks_pb2.AcquireRequest(key="user:alice:secret", owner="alice", ttl_seconds=30),
            metadata=ALICE,
        )
        session = stub.Session(metadata=MALLORY)
        # Naming alice's tenant: NOT_FOUND, for every operation.
        for request in (
            acquire(1, "user:alice:secret", tenant="acme"),
            release(2, "user:alice:secret", held.token, tenant="acme"),
            locks_pb2.SessionRequest(
                id=3,
                refresh=locks_pb2.RefreshRequest(
                    key="user:alice:secret", token=held.token, tenant_id="acme"
                ),
            ),
        ):
            error = (await ask(session, request)).error
            assert (error.code, error.reason) == (
                grpc.StatusCode.NOT_FOUND.value[0],
                "LOCK_NOT_FOUND",
            )
        # In her own tenant she may not name alice's space at all; her own space is hers.
        error = (await ask(session, release(4, "user:alice:secret", held.token))).error
        assert (error.code, error.reason) == (
            grpc.StatusCode.PERMISSION_DENIED.value[0],
            "USER_KEY_FORBIDDEN",
        )
        hers = (await ask(session, acquire(5, "user:mallory:secret"))).lock
        assert hers.token != held.token
        state = await holder(stub, "user:alice:secret")
        assert state.held and state.lock.token == held.token and state.lock.owner == "alice"
        session.cancel()


async def test_a_session_runs_at_most_its_limit_of_requests_at_once(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd, lock_session_max_in_flight=2) as (stub, _, _):
        await taken_by_someone(stub, "user:alice:s5")
        session = stub.Session(metadata=ALICE)
        await session.write(acquire(1, "user:alice:s5", wait_ms=20_000))
        await session.write(acquire(2, "user:alice:s5", wait_ms=20_000))
        # An id still in flight is refused whatever the limit.
        reused = await ask(session, acquire(1, "user:alice:other"))
        assert reused.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert reused.error.metadata["field"] == "id"
        refused = await ask(session, acquire(3, "user:alice:other"))
        assert refused.error.reason == "SESSION_IN_FLIGHT_LIMIT"
        assert refused.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        # The refused request touched nothing; the two in flight still wait.
        assert not (await holder(stub, "user:alice:other")).held
        await wait_for_waiters(stub, "user:alice:s5", 2, metadata=ALICE)
        session.cancel()


async def test_ending_the_stream_abandons_its_waiting_acquires(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, _):
        taken = await taken_by_someone(stub, "user:alice:s6")
        session = stub.Session(metadata=ALICE)
        await session.write(acquire(1, "user:alice:s6", wait_ms=30_000))
        await wait_for_waiters(stub, "user:alice:s6", 1, metadata=ALICE)
        session.cancel()
        # The waiter's key is removed: the holder is alone, and its release frees the lock
        # for the next caller at once (nobody left in the queue).
        await wait_for_waiters(stub, "user:alice:s6", 0, metadata=ALICE)
        await stub.Release(
            locks_pb2.ReleaseRequest(key="user:alice:s6", token=taken.token), metadata=ALICE
        )
        assert not (await holder(stub, "user:alice:s6")).held


async def test_a_session_whose_token_expires_is_ended_unauthenticated(etcd) -> None:  # type: ignore[no-untyped-def]
    key = SigningKey()
    jwks = JwksServer(key)
    try:
        async with locks_service(etcd, **jwt_settings(jwks, auth_jwt_leeway_seconds=0)) as (
            stub,
            _,
            _,
        ):
            expires = int(time.time()) + 3
            session = stub.Session(metadata=bearer(key.sign(claims(exp=expires))))
            lock = (await ask(session, acquire(1, "user:alice:s7"))).lock
            assert lock.token > 0
            # Requests go on being checked: once the token is past its exp, the stream ends.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async with asyncio.timeout(30):
                    for i in range(2, 100_000):
                        await ask(session, release(i, "user:alice:none", 1))
                        await asyncio.sleep(0.2)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_info(caught.value).reason == "TOKEN_EXPIRED"
            assert time.time() >= expires
    finally:
        jwks.close()


async def test_lock_client_takes_and_releases_through_one_session(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, channel):
        client = LockClient(channel, owner="worker", token=USER_TOKEN)
        try:
            for _ in range(3):
                async with client.hold("user:alice:s8", ttl=10, wait_timeout=5) as lock:
                    assert (await holder(stub, "user:alice:s8")).lock.token == lock.token
                assert not (await holder(stub, "user:alice:s8")).held
            assert not client.session.unsupported
        finally:
            await client.close()


class GoneClientStream:
    """The server side of a Session whose client left just as an answer was ready: alice's
    credential, and every write fails as on a finished stream (after noting the answer)."""

    def __init__(self) -> None:
        self.unsent: list[locks_pb2.SessionResponse] = []

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ALICE

    async def write(self, message: locks_pb2.SessionResponse) -> None:
        self.unsent.append(message)
        raise RuntimeError("the stream is finished")


async def test_a_lock_whose_answer_cannot_be_sent_is_released(etcd) -> None:  # type: ignore[no-untyped-def]
    prefix = f"/t/{uuid.uuid4().hex}/"
    app = build_app(LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=prefix))
    async with running_app(app) as svc:
        servicer = svc.app.servicers[0].instance
        stream = GoneClientStream()

        async def requests() -> AsyncIterator[locks_pb2.SessionRequest]:
            yield acquire(1, "user:alice:s10")

        session = LockSession(
            stream,  # type: ignore[arg-type]
            servicer.Acquire,
            servicer.Refresh,
            servicer.Release,
            max_in_flight=4,
        )
        await session.serve(requests())
        # The Acquire took the lock (its answer was ready) ...
        (unsent,) = stream.unsent
        assert unsent.id == 1 and unsent.lock.token > 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as channel:
            stub = locks_pb2_grpc.LockServiceStub(channel)
            # ... and, since nobody could hear of it, gave it back at once.
            state = await holder(stub, "user:alice:s10")
            assert not state.held and not state.waiters
            again = await stub.Release(
                locks_pb2.ReleaseRequest(key="user:alice:s10", token=unsent.lock.token),
                metadata=ALICE,
            )
            assert not again.released


async def waiting_acquires_past_the_session_limit_go_as_calls(
    stub: locks_pb2_grpc.LockServiceStub, client: LockClient
) -> None:
    """Three Acquires of one held key from `client`, whose session takes fewer at once:
    all three queue as waiters (none refused), then each gets the lock in turn."""
    taken = await taken_by_someone(stub, "user:alice:s9")
    waiting = {
        asyncio.create_task(client.acquire("user:alice:s9", ttl=10, wait_timeout=30))
        for _ in range(3)
    }
    await wait_for_waiters(stub, "user:alice:s9", 3, metadata=ALICE)
    await stub.Release(
        locks_pb2.ReleaseRequest(key="user:alice:s9", token=taken.token), metadata=ALICE
    )
    tokens = []
    while waiting:
        done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            lock = task.result()
            tokens.append(lock.token)
            assert await client.release("user:alice:s9", lock.token)
    assert len(set(tokens)) == 3 and min(tokens) > taken.token


async def test_lock_client_sends_what_the_services_session_limit_refuses_as_calls(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd, lock_session_max_in_flight=1) as (stub, _, channel):
        client = LockClient(channel, owner="worker", token=USER_TOKEN)
        try:
            await waiting_acquires_past_the_session_limit_go_as_calls(stub, client)
        finally:
            await client.close()


async def test_lock_client_sends_requests_past_its_own_session_limit_as_calls(etcd) -> None:  # type: ignore[no-untyped-def]
    async with locks_service(etcd) as (stub, _, channel):
        client = LockClient(channel, owner="worker", token=USER_TOKEN)
        client.session.max_in_flight = 1
        try:
            await waiting_acquires_past_the_session_limit_go_as_calls(stub, client)
        finally:
            await client.close()


class UnarySessionlessLocks(locks_pb2_grpc.LockServiceServicer):
    """A lock service from before Session: Acquire and Release only (no etcd)."""

    def __init__(self) -> None:
        self.released: list[int] = []

    async def Acquire(self, request, context):  # type: ignore[no-untyped-def]
        return locks_pb2.Lock(key=request.key, token=7, owner=request.owner)

    async def Release(self, request, context):  # type: ignore[no-untyped-def]
        self.released.append(request.token)
        return locks_pb2.ReleaseResponse(released=True)


async def test_lock_client_falls_back_to_unary_calls_without_session() -> None:
    servicer = UnarySessionlessLocks()
    server = grpc.aio.server()
    locks_pb2_grpc.add_LockServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = LockClient(f"127.0.0.1:{port}", owner="worker")
    try:
        lock = await client.acquire("user:alice:1", ttl=10, wait_timeout=1)
        assert lock.token == 7
        assert await client.release("user:alice:1", lock.token)
        assert client.session.unsupported and servicer.released == [7]
    finally:
        await client.close()
        await server.stop(None)
