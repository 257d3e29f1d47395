"""Helpers for reading typed gRPC errors in lock tests."""

from __future__ import annotations

import asyncio
import time

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from serentak.locks.v1 import locks_pb2


def error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo carried by a failed call (fails the test when there is none)."""
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None, f"no rich status on {exc.code()}: {exc.details()}"
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError("no ErrorInfo in the status details")


async def wait_for_waiters(stub, key: str, count: int, within: float = 10.0):  # type: ignore[no-untyped-def]
    """Poll Describe until `key` has `count` waiters (an observable condition, bounded)."""
    deadline = time.monotonic() + within
    while True:
        state = await stub.Describe(locks_pb2.DescribeRequest(key=key))
        if len(state.waiters) == count:
            return state
        assert time.monotonic() < deadline, f"never saw {count} waiters: {state}"
        await asyncio.sleep(0.01)
