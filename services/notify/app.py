"""Assemble the notify service: database, servicer, job runtime, gauges."""

from __future__ import annotations

from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.common.admin import admin_servicer
from services.common.grpc_server import ServiceApp, Servicer
from services.notify.components import NotifyComponents, build_components
from services.notify.database import migrate
from services.notify.servicer import NotifyServicer
from services.notify.settings import NotifySettings

SERVICE_NAME = notify_pb2.DESCRIPTOR.services_by_name["NotifyService"].full_name


def build_app(settings: NotifySettings, components: NotifyComponents | None = None) -> ServiceApp:
    """The notify service as a `ServiceApp`; migrates its database first.

    The job runtime's workers run in this process: fan-out jobs publish to the streams
    this process holds (see `streams.py` on replicas).
    """
    migrate(settings.database_url)
    parts = components or build_components(settings)
    servicer = NotifyServicer(settings, parts.auth, parts.sessions, parts.inbox, parts.streams)
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
        background=[*parts.runtime.background(), parts.parked.run],
        on_shutdown=[parts.engine.dispose],
        grace_seconds=settings.shutdown_grace_seconds,
        max_message_bytes=settings.max_message_bytes,
    )
