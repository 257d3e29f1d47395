"""Reading the typed error a failed gRPC call carries."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo carried by a failed call (fails the test when there is none)."""
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None, f"no rich status on {exc.code()}: {exc.details()}"
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError("no ErrorInfo in the status details")


def retry_delay(exc: grpc.aio.AioRpcError) -> float:
    """The `google.rpc.RetryInfo` delay (seconds) a failed call carries (fails the test
    when there is none)."""
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None, f"no rich status on {exc.code()}: {exc.details()}"
    for detail in status.details:
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            return retry.retry_delay.ToTimedelta().total_seconds()
    raise AssertionError("no RetryInfo in the status details")
