"""SERENTAK_HEALTH_PORT: a plaintext port with only gRPC Health, sharing the API server's
health (what the Kubernetes manifests' native gRPC probes dial while the API port is TLS)."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.ports import free_port

from services.common.grpc_server import ServiceApp, start

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _check(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return response.status


async def test_health_port_serves_health_only_and_follows_the_api_server() -> None:
    health_port = free_port()
    app = ServiceApp("probe-test", "127.0.0.1", 0, 0, servicers=[], health_port=health_port)
    running = await start(app)
    address = f"127.0.0.1:{health_port}"
    try:
        assert await _check(address) == SERVING
        async with grpc.aio.insecure_channel(address) as channel:
            other = channel.unary_unary("/serentak.locks.v1.LockService/List")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await other(b"", timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # A readiness change on the API server shows on the probe port.
        await running.health.set("", NOT_SERVING)
        assert await _check(address) == NOT_SERVING
    finally:
        await running.stop()
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        async with grpc.aio.insecure_channel(address) as channel:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=2
            )
    assert gone.value.code() in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


async def test_no_health_port_by_default() -> None:
    app = ServiceApp("probe-test", "127.0.0.1", 0, 0, servicers=[])
    running = await start(app)
    try:
        assert app.health_port == 0 and running.health_server is None
    finally:
        await running.stop()
