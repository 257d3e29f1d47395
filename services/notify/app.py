"""Assemble the notify service: database, servicer, background work."""

from __future__ import annotations

from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.common.db import create_engine
from services.common.grpc_server import ServiceApp, Servicer
from services.notify.database import migrate
from services.notify.servicer import NotifyServicer
from services.notify.settings import NotifySettings

SERVICE_NAME = notify_pb2.DESCRIPTOR.services_by_name["NotifyService"].full_name


def build_app(settings: NotifySettings) -> ServiceApp:
    """The notify service as a `ServiceApp`; migrates its database first."""
    migrate(settings.database_url)
    engine = create_engine(settings.database_url, sqlite_synchronous=settings.sqlite_synchronous)
    return ServiceApp(
        name="notify",
        host=settings.bind_host,
        port=settings.notify_port,
        metrics_port=settings.notify_metrics_port,
        servicers=[
            Servicer(
                notify_pb2_grpc.add_NotifyServiceServicer_to_server, NotifyServicer(), SERVICE_NAME
            )
        ],
        on_shutdown=[engine.dispose],
        grace_seconds=settings.shutdown_grace_seconds,
        max_message_bytes=settings.max_message_bytes,
    )
