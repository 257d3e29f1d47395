"""The lock service's rate limits (services/locks/rate_families.py): a Session stream
spends a unit for its call and one per request, with its operation's family; a refused
request is that request's RATE_LIMITED answer and the stream stays open; the unary
Acquire shares the window; the upload service's merges (a service principal) are never
limited."""

from __future__ import annotations

import grpc
import pytest
from locks.isolated_service import locks_service
from locks.principals import SERVICE_TOKEN, USER_TOKEN, bearer
from serentak.locks.v1 import locks_pb2
from support.etcd import EtcdServer
from support.grpc_errors import error_info, retry_delay

pytestmark = pytest.mark.etcd
ALICE = bearer(USER_TOKEN)


def acquire(request_id: int, key: str) -> locks_pb2.SessionRequest:
    return locks_pb2.SessionRequest(
        id=request_id, acquire=locks_pb2.AcquireRequest(key=key, owner="o", ttl_seconds=30)
    )


async def ask(session, request: locks_pb2.SessionRequest) -> locks_pb2.SessionResponse:
    await session.write(request)
    answer = await session.read()
    assert answer is not grpc.aio.EOF and answer.id == request.id
    return answer


async def test_session_requests_are_counted_each_and_refused_alone(etcd: EtcdServer) -> None:
    async with locks_service(etcd, rate_limit_acquire_per_user=4) as (stub, _, _):
        session = stub.Session(metadata=ALICE)  # the stream's call: 1 unit
        held = [await ask(session, acquire(i, f"user:alice:k{i}")) for i in range(3)]
        assert all(a.HasField("lock") for a in held)  # 4 units spent
        refused = await ask(session, acquire(3, "user:alice:k3"))
        assert refused.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert refused.error.reason == "RATE_LIMITED"
        assert dict(refused.error.metadata)["family"] == "acquire"
        # The stream stays open; a Release is another family.
        released = await ask(
            session,
            locks_pb2.SessionRequest(
                id=4,
                release=locks_pb2.ReleaseRequest(key="user:alice:k0", token=held[0].lock.token),
            ),
        )
        assert released.release.released
        await session.done_writing()
        assert await session.read() is grpc.aio.EOF
        # The unary Acquire spends from the same window.
        with pytest.raises(grpc.aio.AioRpcError) as limited:
            await stub.Acquire(
                locks_pb2.AcquireRequest(key="user:alice:k9", owner="o", ttl_seconds=30),
                metadata=ALICE,
            )
        assert limited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_info(limited.value).reason == "RATE_LIMITED"
        assert 0 < retry_delay(limited.value) <= 60
        # The merges' principal takes file: locks past any user's limit.
        for i in range(12):
            lock = await stub.Acquire(
                locks_pb2.AcquireRequest(
                    key=f"file:f{i}", owner="merge", ttl_seconds=30, tenant_id="acme"
                ),
                metadata=bearer(SERVICE_TOKEN),
            )
            assert lock.token > 0
