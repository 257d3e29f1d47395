"""Build, run and gracefully stop one service's grpc.aio server.

Every server has the standard health service, server reflection, each method wrapped at
registration with correlation id, auth prepare and error mapping (rpc_wrapper.py; the
server has no interceptors but OpenTelemetry's when tracing is on), and a Prometheus
endpoint. Shutdown: health goes NOT_SERVING,
background tasks are cancelled, in-flight calls get `shutdown_grace_seconds` to finish.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common import tracing
from services.common.auth import check_bind, require_mode
from services.common.call_capacity import CallCapacity
from services.common.config import ConfigError
from services.common.health_port import start_health_server
from services.common.logging import get_logger
from services.common.malloc_tuning import retain_freed_memory
from services.common.metrics import start_metrics_endpoint
from services.common.rate_limits import RateGate
from services.common.readiness import LIVENESS, Probe, Readiness
from services.common.reflection import enable_reflection
from services.common.rpc_registry import Registrar, WrappingRegistry
from services.common.security import ServerSecurity
from services.common.server_limits import ServerLimits
from services.common.tls import server_credentials

log = get_logger(__name__)


@dataclass(frozen=True)
class Servicer:
    """One gRPC service to register: its `add_*_to_server` function, instance and full name."""

    add_to_server: Callable[[Any, Registrar], None]
    instance: Any
    full_name: str


@dataclass
class ServiceApp:
    """Everything `serve()` needs to run one Serentak service."""

    name: str
    host: str
    port: int
    metrics_port: int
    servicers: Sequence[Servicer]
    # Long-running coroutines (workers, relays); cancelled at shutdown.
    background: Sequence[Callable[[], Awaitable[None]]] = ()
    # Run after the server has stopped (close DB engines, etcd clients).
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = ()
    grace_seconds: float = 5.0
    # Largest request accepted (a bigger one is refused before it is parsed).
    max_message_bytes: int = 4 * 1024 * 1024
    limits: ServerLimits = field(default_factory=ServerLimits)
    # Pools per kind of caller and caps on users' open streams (call_capacity.py); None:
    # only grpc's own `limits.max_concurrent_rpcs`, which counts every call alike.
    capacity: CallCapacity | None = None
    # Rate limits per RPC family, per user and tenant, across replicas (rate_limits/).
    rates: RateGate | None = None
    # Plaintext Health-only port for the kubelet's gRPC probes (health_port.py); 0: none.
    health_port: int = 0
    # Dependencies whose failure makes the service not ready (readiness.py), and how
    # often / how long they are probed.
    probes: Sequence[Probe] = ()
    readiness_interval: float = 5.0
    readiness_timeout: float = 3.0
    # Auth mode, TLS, authenticator (`server_security(settings, auth)`). None: an ad hoc
    # app (tests) that may only listen plaintext on loopback, like dev mode.
    security: ServerSecurity | None = None
    # Filled in by start(): the port actually bound (useful with port 0 in tests).
    bound_port: int = field(default=0, init=False)


class RunningService:
    """A started service: its server, health servicer and background tasks."""

    def __init__(self, app: ServiceApp, server: grpc.aio.Server, health_servicer: Any) -> None:
        self.app = app
        self.server = server
        self.health = health_servicer
        self.tasks: list[asyncio.Task[None]] = []
        self.health_server: grpc.aio.Server | None = None
        self.readiness: Readiness | None = None

    async def stop(self) -> None:
        """Graceful stop: NOT_SERVING, cancel background work, let calls finish."""
        await self.health.enter_graceful_shutdown()
        # A stop never hangs: background work and shutdown hooks get a bounded time each,
        # and whatever outlives it is logged with the await it is stuck in.
        bound = max(self.app.grace_seconds, 5.0)
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            finished, stuck = await asyncio.wait(self.tasks, timeout=bound)
            for task in finished:
                if not task.cancelled() and task.exception() is not None:
                    log.error(
                        "background_task_failed", task=task.get_name(), error=repr(task.exception())
                    )
            for task in stuck:
                log.error(
                    "background_task_stuck_at_stop", task=task.get_name(), stack=_stack_of(task)
                )
        await self.server.stop(self.app.grace_seconds)
        if self.health_server is not None:
            await self.health_server.stop(None)
        for hook in self.app.on_shutdown:
            hook_task = asyncio.ensure_future(hook())
            done, _ = await asyncio.wait([hook_task], timeout=bound)
            if not done:
                log.error("shutdown_hook_stuck", hook=repr(hook), stack=_stack_of(hook_task))
                hook_task.cancel()
            elif hook_task.exception() is not None:
                log.error(
                    "shutdown_hook_failed", hook=repr(hook), error=repr(hook_task.exception())
                )
        log.info("service_stopped", port=self.app.bound_port)


def _stack_of(task: asyncio.Future[Any]) -> str:
    """The await chain a task is suspended in, outermost first (Task.print_stack shows
    only the outermost coroutine), for the log line of one that would not stop."""
    frames: list[str] = []
    awaited: Any = task.get_coro() if isinstance(task, asyncio.Task) else None
    while awaited is not None and len(frames) < 64:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is None:
            frames.append(repr(awaited))
            break
        frames.append(f"{frame.f_code.co_qualname} ({frame.f_code.co_filename}:{frame.f_lineno})")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return " -> ".join(frames)


async def start(app: ServiceApp) -> RunningService:
    """Build and start the server; returns once it listens, reports liveness SERVING and
    readiness as the first round of probes found it (SERVING when there are none).

    Refuses (ConfigError) to listen off loopback in dev mode or without declared security.
    """
    security = app.security
    check_bind(security.auth_mode if security else None, app.host)
    if security is not None and security.auth_mode == "dev":
        log.warning(
            "auth_dev_mode",
            service=app.name,
            message="SERENTAK_AUTH_MODE=dev: fixed dev tokens accepted (loopback only)",
        )
    # No interceptors of ours: grpc.aio would await their chain on every call. Every
    # handler is wrapped once, as it is registered, with what they did (rpc_wrapper.py).
    # The one interceptor is OpenTelemetry's, only when tracing is on (tracing.py).
    server = grpc.aio.server(
        options=[*app.limits.options(app.max_message_bytes), ("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=app.limits.max_concurrent_rpcs,
        interceptors=tracing.server_interceptors() or None,
    )
    registry = WrappingRegistry(
        server, security.authenticator if security is not None else None, app.capacity, app.rates
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registry)
    names = [s.full_name for s in app.servicers]
    for s in app.servicers:
        s.add_to_server(s.instance, registry)
    # Reflection (v1 and v1alpha) describes the services with their protos' comments.
    enable_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name], registry
    )
    address = f"{app.host}:{app.port}"
    if security is not None and security.tls is not None:
        app.bound_port = server.add_secure_port(address, server_credentials(security.tls))
    else:
        app.bound_port = server.add_insecure_port(address)
    if app.bound_port == 0:
        raise OSError(f"cannot listen on {app.host}:{app.port}")
    await server.start()
    running = RunningService(app, server, health_servicer)
    if app.health_port:
        running.health_server = await start_health_server(
            app.host, app.health_port, health_servicer
        )
    for coro_fn in app.background:
        running.tasks.append(asyncio.create_task(_supervised(coro_fn)))
    await health_servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
    # jwt mode: not ready before the signing keys are loaded (the first fetch is this probe).
    probes = [
        *app.probes,
        *(security.authenticator.probes() if security and security.authenticator else ()),
    ]
    readiness = Readiness(
        health_servicer,
        names,
        probes,
        interval=app.readiness_interval,
        timeout=app.readiness_timeout,
    )
    await readiness.check_once()
    running.readiness = readiness
    if probes:
        running.tasks.append(asyncio.create_task(_supervised(readiness.run)))
    log.info(
        "service_started",
        host=app.host,
        port=app.bound_port,
        services=names,
        metrics_port=app.metrics_port,
        tls=bool(security and security.tls),
        mtls=bool(security and security.tls and security.tls.client_ca_file),
    )
    return running


async def _supervised(coro_fn: Callable[[], Awaitable[None]]) -> None:
    """Run a background loop; a crash is logged loudly (a bug), never silently lost."""
    try:
        await coro_fn()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("background_task_crashed", task=getattr(coro_fn, "__qualname__", "?"))
        raise


async def serve(app: ServiceApp) -> None:
    """Run `app` until SIGINT/SIGTERM, then stop gracefully."""
    start_metrics_endpoint(app.host, app.metrics_port)
    running = await start(app)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("service_stopping", grace_seconds=app.grace_seconds)
    finally:
        await running.stop()


def run_service(name: str, settings_cls: type[Any], build_app: Callable[[Any], ServiceApp]) -> None:
    """`python -m services.<name>`: read settings once, configure logs, serve until a signal."""
    from services.common.config import load
    from services.common.logging import configure_logging
    from services.common.migrate import SchemaOutdated

    settings = load(settings_cls)
    # Databases, blobs and temp files: readable by this user only (0600 / 0700).
    os.umask(0o077)
    configure_logging(name, settings.log_format, settings.log_level, once=True)
    # Before build_app: the blob store and the channels it opens are traced when it is on.
    if tracing.configure(
        settings.otlp_endpoint,
        settings.trace_service_name or f"serentak-{name}",
        settings.trace_sample_ratio,
    ):
        log.info("tracing_enabled", otlp_endpoint=settings.otlp_endpoint)
    # Before any request: chunk-sized buffers are then reused, not faulted in again.
    log.info(
        "malloc_tuned",
        retain_bytes=settings.malloc_retain_bytes,
        applied=retain_freed_memory(settings.malloc_retain_bytes),
    )
    try:
        require_mode(settings)  # before build_app touches a database
        app = build_app(settings)
        if app.security is None:
            raise ConfigError(f"{name} declares no security (auth mode, TLS)")
    except SchemaOutdated as exc:
        # Refuse to serve: this code would fail on the old schema, call after call.
        log.error("schema_outdated", message=str(exc), behind=exc.behind)
        raise SystemExit(f"{name}: {exc}") from None
    except ConfigError as exc:
        # A clear line on stderr and a non-zero exit: never a silent insecure default.
        log.error("refusing_to_start", service=name, error=str(exc))
        print(f"{name}: refusing to start: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    app.health_port = settings.health_port
    try:
        asyncio.run(serve(app))
    except ConfigError as exc:
        log.error("refusing_to_start", service=name, error=str(exc))
        print(f"{name}: refusing to start: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    finally:
        # The spans of the last calls are exported before the process ends.
        tracing.shutdown()
