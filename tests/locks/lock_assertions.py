"""Helpers for lock tests: waiting for the waiter queue to reach a size, expecting a
refusal, reading the first answer of a stream."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
from serentak.locks.v1 import locks_pb2
from support.grpc_errors import error_info


async def wait_for_waiters(
    stub, key: str, count: int, within: float = 10.0, metadata=(), tenant=""
):  # type: ignore[no-untyped-def]
    """Poll Describe until `key` has `count` waiters (an observable condition, bounded);
    `metadata` for a stub whose channel sends no credential by itself, `tenant` for a
    service principal's."""
    deadline = time.monotonic() + within
    while True:
        request = locks_pb2.DescribeRequest(key=key, tenant_id=tenant)
        state = await stub.Describe(request, metadata=metadata)
        if len(state.waiters) == count:
            return state
        assert time.monotonic() < deadline, f"never saw {count} waiters: {state}"
        await asyncio.sleep(0.01)


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
