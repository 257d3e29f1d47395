"""Server limits (issue 11, item 8): per-service message size, concurrent calls, keepalive
enforcement. Real servers on 127.0.0.1; each limit is hit and the server keeps serving."""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from support.services import running_app

from services.common.grpc_server import ServiceApp
from services.common.metrics import RPC_HANDLED
from services.common.server_limits import ServerLimits, server_limits
from services.locks.app import build_app as build_locks_app
from services.locks.settings import LocksSettings
from services.notify.settings import NotifySettings
from services.upload.settings import MIB, UploadSettings

ACQUIRE = "/serentak.locks.v1.LockService/Acquire"


def _acquires() -> float:
    return sum(
        s.value
        for m in RPC_HANDLED.collect()
        for s in m.samples
        if s.name.endswith("_total")
        and (s.labels.get("grpc_service"), s.labels.get("grpc_method"))
        == tuple(ACQUIRE.lstrip("/").split("/"))
    )


def test_message_size_defaults_are_per_service() -> None:
    assert LocksSettings().locks_max_message_bytes == 64 * 1024
    assert NotifySettings().notify_max_message_bytes == 1024 * 1024
    upload = UploadSettings()
    # A full chunk plus its envelope, not the 64 MiB every service used to accept.
    assert upload.max_message_bytes == upload.max_chunk_size + MIB
    limits = server_limits(LocksSettings(max_concurrent_rpcs=7, max_ping_strikes=3))
    assert (limits.max_concurrent_rpcs, limits.max_ping_strikes) == (7, 3)
    assert ("grpc.max_receive_message_length", 1234) in limits.options(1234)


async def test_an_oversized_lock_request_is_refused_before_it_is_parsed(etcd) -> None:
    settings = LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=f"/t/{uuid.uuid4().hex}/")
    async with running_app(build_locks_app(settings)) as svc:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{svc.app.bound_port}",
            options=[("grpc.max_send_message_length", 64 * MIB)],
        ) as channel:
            stub = locks_pb2_grpc.LockServiceStub(channel)
            md = (("authorization", "Bearer dev-alice"),)
            before = _acquires()
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Acquire(
                    locks_pb2.AcquireRequest(
                        key="user:alice:x", owner="o" * (60 * MIB), ttl_seconds=5
                    ),
                    metadata=md,
                )
            elapsed = time.monotonic() - started
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # The handler (and the wrapper around it) never saw the message.
            assert _acquires() == before, "the oversized request reached the servicer"
            print(f"60 MiB Acquire refused in {elapsed:.3f} s")
            # Still serving ordinary requests.
            lock = await stub.Acquire(
                locks_pb2.AcquireRequest(key="user:alice:x", owner="me", ttl_seconds=5), metadata=md
            )
            assert lock.token > 0
            assert _acquires() == before + 1


def _health_app(limits: ServerLimits) -> ServiceApp:
    return ServiceApp("t", "127.0.0.1", 0, 0, servicers=[], limits=limits)


async def test_calls_past_max_concurrent_rpcs_are_refused() -> None:
    async with running_app(_health_app(ServerLimits(max_concurrent_rpcs=2))) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(2)]
            for watch in watches:  # both are running in the server now
                assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health.Check(health_pb2.HealthCheckRequest())
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            watches[0].cancel()
            # The slot frees once the server has seen the cancellation.
            deadline = time.monotonic() + 10
            while True:
                try:
                    await health.Check(health_pb2.HealthCheckRequest())
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert time.monotonic() < deadline, "the cancelled call never freed its slot"
                    await asyncio.sleep(0.01)
            watches[1].cancel()


async def test_a_client_pinging_too_often_is_sent_away() -> None:
    limits = ServerLimits(min_client_ping_interval_ms=10_000, max_ping_strikes=1)
    async with running_app(_health_app(limits)) as svc:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{svc.app.bound_port}",
            options=[
                ("grpc.keepalive_time_ms", 50),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0),
            ],
        ) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            # No more data comes on this stream; only the pings do, until the GOAWAY.
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await asyncio.wait_for(watch.read(), 30)
            assert gone.value.code() == grpc.StatusCode.UNAVAILABLE, gone.value
            assert "ping" in (gone.value.details() or "").lower(), gone.value.details()
