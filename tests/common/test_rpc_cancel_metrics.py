"""A server stream the client cancels is counted grpc_code=CANCELLED, exactly once, by the
real per-method wrapper (rpc_wrapper.py, registered through a WrappingRegistry) on a real
server (a stream that never ends on its own, so the server cannot have finished first)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
from prometheus_client import REGISTRY

from services.common.rpc_registry import WrappingRegistry

LABELS = {"grpc_service": "test.Forever", "grpc_method": "Stream", "grpc_type": "server_stream"}


def _count(name: str, **extra: str) -> float:
    return REGISTRY.get_sample_value(name, {**LABELS, **extra}) or 0.0


async def _forever(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    while True:
        yield b"x" * 1024


async def test_a_cancelled_server_stream_is_counted_cancelled() -> None:
    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        _forever, request_deserializer=bytes, response_serializer=bytes
    )
    WrappingRegistry(server, None).add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("test.Forever", {"Stream": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    before = _count("grpc_server_handled_total", grpc_code="CANCELLED")
    started = _count("grpc_server_started_total")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(
                "/test.Forever/Stream", request_serializer=bytes, response_deserializer=bytes
            )(b"")
            assert await call.read() == b"x" * 1024
            call.cancel()
        # The server learns of the cancellation on its own schedule: wait for the count.
        deadline = time.monotonic() + 10
        while _count("grpc_server_handled_total", grpc_code="CANCELLED") == before:
            assert time.monotonic() < deadline, "the cancelled stream was never counted"
            await asyncio.sleep(0.01)
    finally:
        await server.stop(None)
    assert _count("grpc_server_handled_total", grpc_code="CANCELLED") == before + 1
    assert _count("grpc_server_handled_total", grpc_code="OK") == 0
    assert _count("grpc_server_started_total") == started + 1
