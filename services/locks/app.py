"""Assemble the lock service: servicer, server settings, shutdown hooks."""

from __future__ import annotations

from serentak.locks.v1 import locks_pb2, locks_pb2_grpc

from services.common.grpc_server import ServiceApp, Servicer
from services.locks.servicer import LockServicer
from services.locks.settings import LocksSettings

SERVICE_NAME = locks_pb2.DESCRIPTOR.services_by_name["LockService"].full_name


def build_app(settings: LocksSettings) -> ServiceApp:
    """The lock service as a `ServiceApp` ready for `serve()` or `start()`."""
    return ServiceApp(
        name="locks",
        host=settings.bind_host,
        port=settings.locks_port,
        metrics_port=settings.locks_metrics_port,
        servicers=[
            Servicer(locks_pb2_grpc.add_LockServiceServicer_to_server, LockServicer(), SERVICE_NAME)
        ],
        grace_seconds=settings.shutdown_grace_seconds,
        max_message_bytes=settings.max_message_bytes,
    )
