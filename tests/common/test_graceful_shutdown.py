"""Graceful shutdown: health goes NOT_SERVING first, in-flight calls finish within the
grace period, background tasks are cancelled."""

from __future__ import annotations

import asyncio

import grpc
import structlog.testing
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc

from services.common.grpc_server import ServiceApp, Servicer, start


class SlowLocks(locks_pb2_grpc.LockServiceServicer):
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def Acquire(self, request, context):
        self.entered.set()
        await self.release.wait()
        return locks_pb2.Lock(key=request.key, token=7)


async def test_in_flight_call_finishes_while_health_reports_not_serving() -> None:
    servicer = SlowLocks()
    background_cancelled = asyncio.Event()

    async def background_loop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            background_cancelled.set()

    name = locks_pb2.DESCRIPTOR.services_by_name["LockService"].full_name
    app = ServiceApp(
        name="t",
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        servicers=[Servicer(locks_pb2_grpc.add_LockServiceServicer_to_server, servicer, name)],
        background=[background_loop],
        grace_seconds=30,
    )
    running = await start(app)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.bound_port}") as ch:
        in_flight = asyncio.ensure_future(
            locks_pb2_grpc.LockServiceStub(ch).Acquire(locks_pb2.AcquireRequest(key="file:1"))
        )
        await servicer.entered.wait()
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=name))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING

        stopping = asyncio.ensure_future(running.stop())
        second = await watch.read()
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()  # an open Watch is an in-flight call too
        await background_cancelled.wait()
        assert not in_flight.done()

        servicer.release.set()
        reply = await in_flight
        assert reply.token == 7
        await stopping


async def test_stop_never_hangs_on_work_that_ignores_cancellation() -> None:
    """A background task that swallows its cancellation and a shutdown hook that never
    returns are left behind after a bounded wait, each logged with where it is stuck."""
    released = asyncio.Event()
    hook_entered = asyncio.Event()
    loop_started = asyncio.Event()

    async def stubborn_loop() -> None:
        loop_started.set()
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                continue  # the bug this guards against: cancellation swallowed

    async def stuck_hook() -> None:
        hook_entered.set()
        await asyncio.Event().wait()

    app = ServiceApp(
        name="t",
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        servicers=[],
        background=[stubborn_loop],
        on_shutdown=[stuck_hook],
        grace_seconds=0,
    )
    running = await start(app)
    await loop_started.wait()
    try:
        with structlog.testing.capture_logs() as logs:
            await running.stop()
    finally:
        released.set()
    events = [entry["event"] for entry in logs]
    assert "background_task_stuck_at_stop" in events, events
    assert "shutdown_hook_stuck" in events, events
    assert events[-1] == "service_stopped"
    stuck = next(e for e in logs if e["event"] == "background_task_stuck_at_stop")
    assert "stubborn_loop" in stuck["stack"]
    assert hook_entered.is_set()
