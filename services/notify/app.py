"""Assemble the notify service: database, servicer, job runtime, gauges."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.common.admin import admin_servicer
from services.common.call_capacity import CallCapacity, CapacityLimits
from services.common.db import dispose_when_returned
from services.common.grpc_server import ServiceApp, Servicer
from services.common.logging import get_logger
from services.common.rate_limits import Limiter, RateGate, database_store
from services.common.readiness import database_probe
from services.common.security import server_security
from services.common.server_limits import server_limits
from services.notify.components import NotifyComponents, build_components
from services.notify.database import migration_locations, prepare
from services.notify.gc_tuning import frozen_heap
from services.notify.rate_families import rate_policy
from services.notify.servicer import NotifyServicer
from services.notify.settings import NotifySettings

log = get_logger(__name__)
SERVICE_NAME = notify_pb2.DESCRIPTOR.services_by_name["NotifyService"].full_name


def build_app(settings: NotifySettings, components: NotifyComponents | None = None) -> ServiceApp:
    """The notify service as a `ServiceApp`; migrates or checks its schema first.

    The job runtime's workers run in this process: fan-out jobs publish to the streams
    this process holds; on PostgreSQL the stream listener brings other replicas' commits
    (see `streams.py` on replicas). On SQLite live delivery is in-process only.
    """
    prepare(settings.database_url, migrate_on_start=settings.migrate_on_start)
    parts = components or build_components(settings)
    background = [*parts.runtime.background(), parts.parked.run]
    if settings.notify_gc_freeze:
        background.append(frozen_heap(settings.notify_gc_young_threshold))
    if parts.stream_listener is not None:
        background.append(parts.stream_listener.run)
    if parts.remote_deliveries is not None:
        background.append(parts.remote_deliveries.run)
        log.info("notify_replicas", mode="multi", delivery="postgresql LISTEN/NOTIFY")
    else:
        log.warning(
            "notify_single_replica",
            reason="SQLite: Subscribe streams only hear this process's commits; "
            "run exactly one notify replica (use PostgreSQL for several)",
        )
    servicer = NotifyServicer(settings, parts.auth, parts.sessions, parts.inbox, parts.streams)
    # Counted in notify's database: PostgreSQL is shared by every replica; SQLite (one
    # replica by nature) counts in memory.
    limiter = Limiter(
        database_store(settings.database_url),
        service="notify",
        window_seconds=settings.rate_limit_window_seconds,
        batch_max=settings.rate_limit_batch_max,
    )
    return ServiceApp(
        name="notify",
        host=settings.bind_host,
        port=settings.notify_port,
        metrics_port=settings.notify_metrics_port,
        servicers=[
            Servicer(notify_pb2_grpc.add_NotifyServiceServicer_to_server, servicer, SERVICE_NAME),
            # Queue stats and dead letters of the job runtime (service credential only).
            admin_servicer(parts.sessions, parts.auth),
        ],
        background=background,
        on_shutdown=[partial(dispose_when_returned, parts.engine), limiter.close],
        probes=[database_probe("notify", parts.engine, migration_locations())],
        readiness_interval=settings.readiness_interval_seconds,
        readiness_timeout=settings.readiness_timeout_seconds,
        grace_seconds=settings.shutdown_grace_seconds,
        security=server_security(settings, parts.auth),
        max_message_bytes=settings.notify_max_message_bytes,
        # No grpc-wide limit: it counts every call alike, so user streams refused the
        # relay's IngestBatch (issue 37). The capacity gate bounds every call instead, per
        # kind of caller; `max_concurrent_rpcs` bounds users' calls there.
        # Room for a replica's worth of streams opening at once (grpc refuses calls at
        # random past 1,000 it has not handed over yet).
        limits=replace(
            server_limits(settings),
            max_concurrent_rpcs=None,
            max_pending_requests=max(1000, settings.streams_max),
            max_pending_requests_hard_limit=2 * max(1000, settings.streams_max),
        ),
        capacity=CallCapacity(capacity_limits(settings)),
        rates=RateGate(rate_policy(settings), limiter, parts.auth),
    )


def capacity_limits(settings: NotifySettings) -> CapacityLimits:
    """The pools and stream caps configured in `settings`."""
    return CapacityLimits(
        service_calls=settings.service_calls_max,
        user_calls=settings.max_concurrent_rpcs,
        streams=settings.streams_max,
        streams_per_tenant=settings.streams_per_tenant_max,
        streams_per_user=settings.streams_per_user_max,
        call_retry_seconds=settings.call_retry_seconds,
        stream_retry_seconds=settings.stream_retry_seconds,
    )
