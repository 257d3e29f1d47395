"""Every response carries the call's correlation id back: a unary one in its trailing
metadata (with the response or with the error status), a response stream in its initial
metadata. The id the caller sent, or a fresh one; and the servicer sees the same id."""

from __future__ import annotations

import grpc
import pytest
from grpc_status import rpc_status
from serentak.channels import channel_options
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from support.services import lock_service_app, running_app

from services.common import correlation, errors
from services.common.grpc_server import ServiceApp

KEY = correlation.METADATA_KEY


class EchoLocks(locks_pb2_grpc.LockServiceServicer):
    """Acquire answers with the id it runs under; Refresh raises a domain error, Describe
    is a bug, Release is UNAVAILABLE (counted); Hold streams the id once."""

    def __init__(self) -> None:
        self.releases = 0

    async def Release(self, request, context):
        self.releases += 1
        raise errors.Unavailable("etcd is away")

    async def Acquire(self, request, context):
        return locks_pb2.Lock(key=request.key, correlation_id=correlation.current_correlation_id())

    async def Refresh(self, request, context):
        raise errors.Aborted("stale", reason="STALE_FENCING_TOKEN")

    async def Describe(self, request, context):
        return {}["missing"]  # a bug: KeyError

    async def Hold(self, request_iterator, context):
        yield locks_pb2.HoldEvent(
            held=locks_pb2.Lock(correlation_id=correlation.current_correlation_id())
        )


def _app(servicer: EchoLocks | None = None) -> ServiceApp:
    return lock_service_app(servicer or EchoLocks())


async def test_unary_response_echoes_the_sent_id_in_trailing_metadata() -> None:
    async with running_app(_app()) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            stub = locks_pb2_grpc.LockServiceStub(ch)
            call = stub.Acquire(locks_pb2.AcquireRequest(key="file:1"), metadata=((KEY, "c-7"),))
            lock = await call
            assert lock.correlation_id == "c-7"
            assert dict(await call.trailing_metadata())[KEY] == "c-7"
            assert KEY not in dict(await call.initial_metadata())


async def test_unary_without_an_id_gets_a_fresh_one_each_call() -> None:
    async with running_app(_app()) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            stub = locks_pb2_grpc.LockServiceStub(ch)
            seen = set()
            for _ in range(3):
                call = stub.Acquire(locks_pb2.AcquireRequest(key="file:1"))
                lock = await call
                echoed = dict(await call.trailing_metadata())[KEY]
                assert echoed == lock.correlation_id and len(echoed) == 32
                seen.add(echoed)
            assert len(seen) == 3
            # An id past 128 characters is replaced, not echoed.
            long_id = "x" * 129
            call = stub.Acquire(locks_pb2.AcquireRequest(key="file:1"), metadata=((KEY, long_id),))
            await call
            assert len(dict(await call.trailing_metadata())[KEY]) == 32


@pytest.mark.parametrize(
    ("rpc", "code"),
    [("Refresh", grpc.StatusCode.ABORTED), ("Describe", grpc.StatusCode.INTERNAL)],
)
async def test_unary_error_keeps_the_id_and_its_status_details(
    rpc: str, code: grpc.StatusCode
) -> None:
    requests = {
        "Refresh": locks_pb2.RefreshRequest(key="file:1", token=1),
        "Describe": locks_pb2.DescribeRequest(key="file:1"),
    }
    async with running_app(_app()) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            stub = locks_pb2_grpc.LockServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await getattr(stub, rpc)(requests[rpc], metadata=((KEY, "err-1"),))
            assert caught.value.code() == code
            assert dict(caught.value.trailing_metadata())[KEY] == "err-1"
            assert dict(caught.value.initial_metadata())[KEY] == "err-1"
            if code == grpc.StatusCode.ABORTED:
                status = rpc_status.from_call(caught.value)
                assert status is not None and status.details, "ErrorInfo lost"


async def test_response_stream_echoes_the_id_in_initial_metadata() -> None:
    async with running_app(_app()) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            call = locks_pb2_grpc.LockServiceStub(ch).Hold(
                iter([locks_pb2.HoldRequest()]), metadata=((KEY, "s-1"),)
            )
            assert dict(await call.initial_metadata())[KEY] == "s-1"
            events = [event async for event in call]
            assert [e.held.correlation_id for e in events] == ["s-1"]


async def test_a_handlers_unavailable_is_not_resent_by_the_clients_retry_policy() -> None:
    # Release is in the channel's retry policy (UNAVAILABLE, 4 attempts): the server's own
    # answer is final, the caller decides (only a connection failure is re-sent by gRPC).
    servicer = EchoLocks()
    async with running_app(_app(servicer)) as svc:
        address = f"127.0.0.1:{svc.app.bound_port}"
        options = channel_options(["serentak.locks.v1.LockService/Release"])
        async with grpc.aio.insecure_channel(address, options=options) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await locks_pb2_grpc.LockServiceStub(ch).Release(
                    locks_pb2.ReleaseRequest(key="file:1", token=1)
                )
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert servicer.releases == 1
