"""Readiness: the standard gRPC health service reflects whether dependencies are usable.

Health service names (one server, three meanings):
- `""` (the empty name) is liveness: SERVING from start to graceful shutdown, whatever
  the dependencies do. Restarting a process does not bring a database back, so a liveness
  probe must never fail because of one.
- `readiness`, and each registered service's full name (e.g.
  `serentak.notify.v1.NotifyService`), are readiness: NOT_SERVING while any probe fails,
  SERVING again once all pass. Route traffic by these (Kubernetes readinessProbe
  `grpc.service: readiness`; client-side health checking by the service's full name).

A probe is one cheap call to a dependency (`SELECT` of the migration version tables, an
etcd range read, a blob store HEAD) that raises when the dependency is down. `Readiness`
runs all probes every `interval` seconds, each bounded by `timeout`, and logs
`readiness_changed` (with the failing probes and their errors) on every transition only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grpc_health.v1 import health_pb2
from prometheus_client import Gauge

from services.common.logging import get_logger

log = get_logger(__name__)

LIVENESS = ""
READINESS = "readiness"

DEPENDENCY_UP = Gauge(
    "serentak_dependency_up",
    "1 while the readiness probe of a dependency passes, 0 while it fails.",
    ["dependency"],
)
READY = Gauge("serentak_ready", "1 while every readiness probe passes (health SERVING).")


@dataclass(frozen=True)
class Probe:
    """One dependency check: `check()` returns when `name` is usable and raises otherwise."""

    name: str
    check: Callable[[], Awaitable[object]]


class Readiness:
    """Runs the probes and keeps the readiness health statuses in step with them."""

    def __init__(
        self,
        health_servicer: Any,
        service_names: Sequence[str],
        probes: Sequence[Probe],
        *,
        interval: float,
        timeout: float,
    ) -> None:
        self._health = health_servicer
        self._names = [READINESS, *service_names]
        self._probes = list(probes)
        self._interval = interval
        self._timeout = timeout
        self.ready: bool | None = None  # None until the first round

    async def _run_probe(self, probe: Probe) -> str | None:
        """None when `probe` passes, else why it failed."""
        try:
            async with asyncio.timeout(self._timeout):
                await probe.check()
        except TimeoutError:
            return f"no answer within {self._timeout:g} s"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:500]
        return None

    async def check_once(self) -> bool:
        """Run every probe once and publish the result; True when all pass."""
        results = await asyncio.gather(*(self._run_probe(p) for p in self._probes))
        failing = {p.name: err for p, err in zip(self._probes, results, strict=True) if err}
        for probe, err in zip(self._probes, results, strict=True):
            DEPENDENCY_UP.labels(probe.name).set(0 if err else 1)
        ready = not failing
        if ready != self.ready:
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if ready
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for name in self._names:
                await self._health.set(name, status)
            READY.set(1 if ready else 0)
            if ready:
                log.info("readiness_changed", ready=True, was=self.ready)
            else:
                log.warning("readiness_changed", ready=False, was=self.ready, failing=failing)
            self.ready = ready
        return ready

    async def run(self) -> None:
        """Probe every `interval` seconds until cancelled."""
        while True:
            # The probe period, not synchronisation.
            await asyncio.sleep(self._interval)
            await self.check_once()


def database_probe(service: str, engine: Any, locations: Sequence[tuple[Any, str]]) -> Probe:
    """Probe `database`: reachable, and its schema not older than this code (the version
    tables read in one connection; `SchemaOutdated` names the folders behind)."""
    from services.common.migrate import SchemaOutdated, behind, expected, read_versions

    expectations = expected(list(locations))
    tables = [e.version_table for e in expectations]

    async def check() -> None:
        async with engine.connect() as conn:
            current = await conn.run_sync(lambda sync_conn: read_versions(sync_conn, tables))
        reasons = behind(current, expectations)
        if reasons:
            raise SchemaOutdated(service, reasons)

    return Probe("database", check)
