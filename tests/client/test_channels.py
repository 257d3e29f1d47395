"""The one channel factory, against real loopback servers: several addresses share the
calls, gRPC retries UNAVAILABLE only for the methods named idempotent, and a service's
token file is re-read when it changes."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from serentak.channels import open_channel, target
from serentak.credentials import ClientSecurity, ClientToken
from serentak.errors import ConfigError

CHECK = "grpc.health.v1.Health/Check"


class RecordingHealth(health.aio.HealthServicer):
    """Answers Check, after failing the first `fail_first` calls with UNAVAILABLE."""

    def __init__(self, fail_first: int = 0) -> None:
        super().__init__()
        self.calls = 0
        self.fail_first = fail_first
        self.tokens: list[str | None] = []

    async def Check(self, request, context):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.tokens.append(dict(context.invocation_metadata()).get("authorization"))
        if self.calls <= self.fail_first:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@contextlib.asynccontextmanager
async def serving(servicer: RecordingHealth) -> AsyncIterator[str]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def test_targets() -> None:
    assert target("127.0.0.1:1") == "127.0.0.1:1"
    assert target("dns:///locks.internal:50052") == "dns:///locks.internal:50052"
    assert target("10.0.0.1:1, 10.0.0.2:1") == "ipv4:10.0.0.1:1,10.0.0.2:1"
    assert target("[::1]:1,[::1]:2") == "ipv6:[::1]:1,[::1]:2"
    for bad in ("a.internal:1,b.internal:1", "10.0.0.1:1,[::1]:2", "10.0.0.1,10.0.0.2"):
        with pytest.raises(ConfigError):
            target(bad)


async def test_calls_are_spread_over_every_address() -> None:
    first, second = RecordingHealth(), RecordingHealth()
    async with serving(first) as a, serving(second) as b:
        async with open_channel(f"{a},{b}", ClientSecurity()) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(20):
                await stub.Check(health_pb2.HealthCheckRequest(), wait_for_ready=True)
    assert first.calls > 0 and second.calls > 0
    assert first.calls + second.calls == 20


async def test_unavailable_is_retried_only_for_idempotent_methods() -> None:
    retried, not_retried = RecordingHealth(fail_first=2), RecordingHealth(fail_first=2)
    async with serving(retried) as a, serving(not_retried) as b:
        async with open_channel(a, ClientSecurity(), retry=[CHECK]) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest()
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        async with open_channel(b, ClientSecurity()) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert retried.calls == 3 and not_retried.calls == 1


async def test_the_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    servicer = RecordingHealth()
    async with serving(servicer) as address:
        security = ClientSecurity(token=ClientToken(path=token_file))
        async with open_channel(address, security) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await stub.Check(health_pb2.HealthCheckRequest())
            renewed = tmp_path / "token.new"
            renewed.write_text("second-token-longer\n")
            renewed.replace(token_file)  # how a sidecar renews it: atomically
            await stub.Check(health_pb2.HealthCheckRequest())
    assert servicer.tokens == ["Bearer first-token", "Bearer second-token-longer"]


def _non_loopback_address() -> str | None:
    """This machine's address on its default route, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # UDP: no packet is sent
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


async def test_a_plaintext_channel_never_reaches_off_loopback() -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address")
    servicer = RecordingHealth()
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"{address}:0")
    await server.start()
    try:
        # The server is reachable (a raw insecure channel gets an answer)...
        async with grpc.aio.insecure_channel(f"{address}:{port}") as raw:
            await health_pb2_grpc.HealthStub(raw).Check(health_pb2.HealthCheckRequest())
        # ...but our plaintext channel (local credentials) refuses a non-loopback peer, so
        # a token never travels a network in clear.
        security = ClientSecurity(token=ClientToken("secret"))
        async with open_channel(f"{address}:{port}", security) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert servicer.tokens == [None]  # only the raw call arrived, without a token
    finally:
        await server.stop(0)
