"""Run Serentak services for tests: in-process (fast) or as `python -m` processes (real)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc

from services.common.grpc_server import RunningService, ServiceApp, Servicer, start
from support.ports import free_port
from support.process import stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


@contextlib.asynccontextmanager
async def running_app(app: ServiceApp) -> AsyncIterator[RunningService]:
    """Start `app` in this event loop on a free port (metrics off); stop it afterwards."""
    app = replace(app, port=0, metrics_port=0)
    service = await start(app)
    try:
        yield service
    finally:
        await service.stop()


def lock_service_app(servicer: object) -> ServiceApp:
    """`servicer` served as the LockService with the shared per-method wrapping and nothing else:
    for tests of the common gRPC plumbing (errors, correlation ids, metrics)."""
    name = locks_pb2.DESCRIPTOR.services_by_name["LockService"].full_name
    return ServiceApp(
        name="t",
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        servicers=[Servicer(locks_pb2_grpc.add_LockServiceServicer_to_server, servicer, name)],
    )


@dataclass
class ServiceProcess:
    """A service started as `python -m services.<name>`, with its log file."""

    name: str
    port: int
    metrics_port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def address(self) -> str:
        """host:port of its gRPC server."""
        return f"127.0.0.1:{self.port}"

    def log_text(self) -> str:
        """Everything the process has logged so far."""
        return self.log_path.read_text(errors="replace")


def wait_serving(address: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Block until the server at `address` answers health SERVING (or raise)."""
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        stub = health_pb2_grpc.HealthStub(channel)
        # Watch streams status changes: no polling needed.
        for update in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=timeout):
            if update.status == health_pb2.HealthCheckResponse.SERVING:
                return
    raise RuntimeError(f"{address} never reported SERVING")


@contextlib.contextmanager
def service_process(
    name: str, tmp_path: Path, env: dict[str, str] | None = None, port: int | None = None
) -> Iterator[ServiceProcess]:
    """Run `python -m services.<name>` with its data in `tmp_path`, on `port` or a free one.

    Passing the same `port` again restarts a service at the same address.
    """
    port, metrics_port = port or free_port(), free_port()
    full_env = {
        **os.environ,
        "SERENTAK_DATA_DIR": str(tmp_path / "data"),
        # Fresh test databases: migrate at start as `make run` does (tests override it).
        "SERENTAK_MIGRATE_ON_START": "true",
        # Explicit: a service with no auth mode refuses to start.
        "SERENTAK_AUTH_MODE": "dev",
        f"SERENTAK_{name.upper()}_PORT": str(port),
        f"SERENTAK_{name.upper()}_METRICS_PORT": str(metrics_port),
        # The checkout's client package too, not whichever one is installed.
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "client")]),
        # The upload process's webhook listener: a free port, so parallel services never collide.
        "SERENTAK_SYNC_WEBHOOK_PORT": str(free_port()),
        **(env or {}),
    }
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", f"services.{name}"],
            cwd=REPO_ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    svc = ServiceProcess(name, port, metrics_port, process, log_path)
    try:
        try:
            wait_serving(svc.address)
        except Exception as exc:
            process.kill()
            raise RuntimeError(f"{name} did not start: {svc.log_text()[-3000:]}") from exc
        yield svc
    finally:
        if process.poll() is None:
            stop_process(process, timeout=15)
