"""A typed domain error raised in a handler arrives as its mapped code and ErrorInfo reason;
anything else is INTERNAL; an RPC not built yet is UNIMPLEMENTED."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from support.services import lock_service_app, running_app

from services.common import errors
from services.common.grpc_server import ServiceApp

CASES = [
    (
        errors.InvalidArgument("ttl_seconds", "must be 2..3600"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    ),
    (
        errors.NotFound("no such file", reason="FILE_NOT_FOUND"),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    ),
    (
        errors.AlreadyExists("chunk differs", reason="CHUNK_CONFLICT", chunk_index=3),
        grpc.StatusCode.ALREADY_EXISTS,
        "CHUNK_CONFLICT",
    ),
    (
        errors.FailedPrecondition("gone", reason="FILE_RETENTION_EXPIRED"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_RETENTION_EXPIRED",
    ),
    (
        errors.Aborted("stale", reason="STALE_FENCING_TOKEN"),
        grpc.StatusCode.ABORTED,
        "STALE_FENCING_TOKEN",
    ),
    (errors.ResourceExhausted("too big"), grpc.StatusCode.RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED"),
    (errors.Unauthenticated("who?"), grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"),
    (errors.PermissionDenied("no"), grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"),
]


class RaisingLocks(locks_pb2_grpc.LockServiceServicer):
    """Acquire raises whatever the test put in `to_raise`; Describe is a plain bug."""

    to_raise: Exception = RuntimeError("unset")

    async def Acquire(self, request, context):
        raise self.to_raise

    async def Describe(self, request, context):
        return {}["missing"]  # a bug: KeyError

    async def Hold(self, request_iterator, context):
        yield locks_pb2.HoldEvent()
        raise errors.FailedPrecondition("lost", reason="LOCK_LOST")


def _app(servicer: RaisingLocks) -> ServiceApp:
    return lock_service_app(servicer)


def _error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(err)
    assert status is not None, "status details missing"
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return info


async def test_each_domain_error_maps_to_its_code_and_reason() -> None:
    servicer = RaisingLocks()
    async with running_app(_app(servicer)) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            stub = locks_pb2_grpc.LockServiceStub(ch)
            for exc, code, reason in CASES:
                servicer.to_raise = exc
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Acquire(locks_pb2.AcquireRequest(key="file:1"))
                assert caught.value.code() == code
                info = _error_info(caught.value)
                assert info.reason == reason
                assert info.domain == errors.ERROR_DOMAIN
                if isinstance(exc, errors.InvalidArgument):
                    assert info.metadata["field"] == "ttl_seconds"
                if reason == "CHUNK_CONFLICT":
                    assert info.metadata["chunk_index"] == "3"


async def test_unexpected_exception_is_internal_and_unbuilt_rpc_is_unimplemented() -> None:
    async with running_app(_app(RaisingLocks())) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            stub = locks_pb2_grpc.LockServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as bug:
                await stub.Describe(locks_pb2.DescribeRequest(key="file:1"))
            assert bug.value.code() == grpc.StatusCode.INTERNAL
            with pytest.raises(grpc.aio.AioRpcError) as unbuilt:
                await stub.Release(locks_pb2.ReleaseRequest(key="file:1", token=1))
            assert unbuilt.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_domain_error_inside_a_response_stream_keeps_its_reason() -> None:
    async with running_app(_app(RaisingLocks())) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            call = locks_pb2_grpc.LockServiceStub(ch).Hold(iter([locks_pb2.HoldRequest()]))
            received = []
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for event in call:
                    received.append(event)
            assert len(received) == 1
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert _error_info(caught.value).reason == "LOCK_LOST"
