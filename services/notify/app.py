"""Assemble the notify service: database, servicer, background work."""

from __future__ import annotations

from datetime import timedelta

from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.common.admin import admin_servicer
from services.common.auth import Authenticator
from services.common.db import create_engine, session_factory
from services.common.grpc_server import ServiceApp, Servicer
from services.notify.database import migrate
from services.notify.inbox import Inbox
from services.notify.retention import RetentionSweeper
from services.notify.servicer import NotifyServicer
from services.notify.settings import NotifySettings
from services.notify.streams import Broker, StreamReader

SERVICE_NAME = notify_pb2.DESCRIPTOR.services_by_name["NotifyService"].full_name


def build_app(settings: NotifySettings) -> ServiceApp:
    """The notify service as a `ServiceApp`; migrates its database first."""
    migrate(settings.database_url)
    engine = create_engine(settings.database_url, sqlite_synchronous=settings.sqlite_synchronous)
    sessions = session_factory(engine)
    broker = Broker(settings.stream_buffer_size)
    inbox = Inbox(
        sessions,
        broker,
        digest_window=timedelta(seconds=settings.digest_window_seconds),
        max_audience=settings.max_audience,
    )
    auth = Authenticator(settings.auth_tokens, settings.service_token)
    servicer = NotifyServicer(
        settings,
        auth,
        sessions,
        inbox,
        StreamReader(sessions, broker),
    )
    retention = RetentionSweeper(
        sessions,
        interval=timedelta(seconds=settings.retention_interval_seconds),
        read_older_than=timedelta(seconds=settings.read_retention_seconds),
        inbox_older_than=timedelta(seconds=settings.inbox_retention_seconds),
    )
    return ServiceApp(
        name="notify",
        host=settings.bind_host,
        port=settings.notify_port,
        metrics_port=settings.notify_metrics_port,
        servicers=[
            Servicer(notify_pb2_grpc.add_NotifyServiceServicer_to_server, servicer, SERVICE_NAME),
            # Queue stats and dead letters of the job runtime (service credential only).
            admin_servicer(sessions, auth),
        ],
        background=[retention.run],
        on_shutdown=[engine.dispose],
        grace_seconds=settings.shutdown_grace_seconds,
        max_message_bytes=settings.max_message_bytes,
    )
