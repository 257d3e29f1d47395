"""A plaintext port that serves only gRPC Health, for the kubelet's native gRPC probes.

The kubelet cannot speak TLS to a probe target, so a service whose API port requires TLS
exposes its health here too (`SERENTAK_HEALTH_PORT`, 0: off). It shares the API server's
health servicer, so readiness changes and graceful shutdown show on both ports; nothing
but Health/Check and Health/Watch is reachable on it.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc


async def start_health_server(host: str, port: int, health_servicer: Any) -> grpc.aio.Server:
    """Listen on host:port with only `health_servicer` registered; returns the started server."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen on {host}:{port} (health port)")
    await server.start()
    return server
