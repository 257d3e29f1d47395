"""Who is calling: a bearer token in gRPC metadata mapped to a tenant and a user.

The dev-mode token table lives in settings; a service credential marks service-to-service
calls (e.g. the upload service's relay calling notify's Ingest).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

import grpc

from services.common.errors import PermissionDenied, Unauthenticated


@dataclass(frozen=True, slots=True)
class Identity:
    """The caller of one RPC."""

    tenant_id: str
    user_id: str
    is_service: bool = False


def _bearer_token(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token:
                return token.strip()
    return None


class Authenticator:
    """Maps bearer tokens to identities using the settings' token table."""

    def __init__(self, tokens: dict[str, dict[str, str]], service_token: str) -> None:
        self._tokens = dict(tokens)
        self._service_token = service_token

    def identify(self, context: grpc.aio.ServicerContext) -> Identity:
        """The caller's identity; UNAUTHENTICATED without a known token."""
        token = _bearer_token(context)
        if token is None:
            raise Unauthenticated("missing bearer token", reason="MISSING_CREDENTIALS")
        if hmac.compare_digest(token, self._service_token):
            return Identity(tenant_id="", user_id="", is_service=True)
        entry = self._tokens.get(token)
        if entry is None:
            raise Unauthenticated("unknown bearer token", reason="INVALID_CREDENTIALS")
        return Identity(tenant_id=entry["tenant_id"], user_id=entry["user_id"])

    def require_user(self, context: grpc.aio.ServicerContext) -> Identity:
        """The calling user; services acting without a user are refused."""
        identity = self.identify(context)
        if identity.is_service:
            raise PermissionDenied("this call needs a user credential", reason="USER_REQUIRED")
        return identity

    def require_service(self, context: grpc.aio.ServicerContext) -> Identity:
        """Only the service credential passes."""
        identity = self.identify(context)
        if not identity.is_service:
            raise PermissionDenied("this call is for services only", reason="SERVICE_REQUIRED")
        return identity
