"""AdminService (queue stats, dead letters) for any service that embeds the job runtime."""

from __future__ import annotations

from serentak.admin.v1 import admin_pb2_grpc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.admin.servicer import SERVICE_NAME, AdminServicer
from services.common.auth import Authenticator
from services.common.grpc_server import Servicer


def admin_servicer(
    sessions: async_sessionmaker[AsyncSession], authenticator: Authenticator
) -> Servicer:
    """The AdminService, ready for `ServiceApp.servicers`."""
    return Servicer(
        admin_pb2_grpc.add_AdminServiceServicer_to_server,
        AdminServicer(sessions, authenticator),
        SERVICE_NAME,
    )


__all__ = ["SERVICE_NAME", "AdminServicer", "admin_servicer"]
