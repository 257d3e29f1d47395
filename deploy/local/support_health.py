"""Wait for several gRPC servers to report health SERVING."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serentak.channels import open_sync_channel
from serentak.credentials import ClientSecurity


def wait_all_serving(
    addresses: dict[str, str], give_up: Callable[[], bool], timeout: float = 120.0
) -> None:
    """Return when every address answers SERVING; raise SystemExit on timeout or give_up()."""
    deadline = time.monotonic() + timeout
    pending = dict(addresses)
    while pending:
        if give_up() or time.monotonic() > deadline:
            raise SystemExit(f"not serving: {', '.join(pending)}")
        for name, address in list(pending.items()):
            with open_sync_channel(address, ClientSecurity()) as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(), timeout=1
                    )
                except grpc.RpcError:
                    continue
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    del pending[name]
        time.sleep(0.2)
