"""The caller of an RPC: a bearer token (dev table or JWT), else a mapped client certificate.

Servicers ask for what the RPC needs: `require_user` (user RPCs), `require_service` with
the principals allowed (e.g. notify's Ingest: only `upload`), `require_ops` (admin RPCs).
"""

from __future__ import annotations

from collections.abc import Collection
from contextvars import ContextVar
from typing import Any, Protocol

import grpc

from services.common.auth.dev_tokens import DevTokens
from services.common.auth.identity import OPS_ROLE, Identity
from services.common.auth.peers import PeerPrincipals
from services.common.config import DEFAULT_AUTH_TOKENS, DEFAULT_SERVICE_TOKENS
from services.common.errors import PermissionDenied, Unauthenticated
from services.common.readiness import Probe

# The identity verified for the current call (its context and token): the capacity gate
# (call_capacity.py) identifies the caller before the servicer does, and a JWT is
# verified once per call. grpc.aio runs each call in a task of its own, whose context
# this var lives in.
_CALL_IDENTITY: ContextVar[tuple[Any, str, Identity] | None] = ContextVar(
    "serentak_call_identity", default=None
)


class TokenVerifier(Protocol):
    """Turns a bearer token into an identity (dev table or JWT)."""

    def verify(self, token: str) -> Identity:
        """The token's identity; raises Unauthenticated with a precise reason."""
        ...

    async def refresh_keys(self, token: str) -> None:
        """Fetch whatever `verify(token)` will need (signing keys); no-op if nothing."""
        ...

    def probes(self) -> list[Probe]:
        """Readiness probes for what `verify` needs loaded before the first call."""
        ...


def bearer_token(context: grpc.aio.ServicerContext) -> str | None:
    """The `authorization: Bearer ...` token of the call, if any."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token:
                return token.strip()
    return None


class Authenticator:
    """Identifies callers and checks what kind of caller an RPC admits."""

    def __init__(self, tokens: TokenVerifier, peers: PeerPrincipals | None = None) -> None:
        self._tokens = tokens
        self._peers = peers or PeerPrincipals({})

    @classmethod
    def dev(
        cls,
        users: dict[str, dict[str, str]] | None = None,
        services: dict[str, str] | None = None,
    ) -> Authenticator:
        """dev-mode tables (the defaults unless given): for tests and `make run`."""
        return cls(
            DevTokens(
                DEFAULT_AUTH_TOKENS if users is None else users,
                DEFAULT_SERVICE_TOKENS if services is None else services,
            )
        )

    async def prepare(self, context: grpc.aio.ServicerContext) -> None:
        """Before the RPC runs (rpc_wrapper.py): fetch keys its token needs, off the loop."""
        token = bearer_token(context)
        if token is not None:
            await self._tokens.refresh_keys(token)

    def probes(self) -> list[Probe]:
        """Readiness probes of the token verifier (jwt: the `jwks` keys are loaded)."""
        return self._tokens.probes()

    def identify(self, context: grpc.aio.ServicerContext) -> Identity:
        """The caller's identity; UNAUTHENTICATED without valid credentials."""
        token = bearer_token(context)
        if token is not None:
            cached = _CALL_IDENTITY.get()
            if cached is not None and cached[0] is context and cached[1] == token:
                return cached[2]
            identity = self._tokens.verify(token)
            _CALL_IDENTITY.set((context, token, identity))
            return identity
        principal = self._peers.principal(context)
        if principal is not None:
            return Identity.for_service(principal)
        raise Unauthenticated("missing bearer token", reason="MISSING_CREDENTIALS")

    @staticmethod
    def forget_call_identity() -> None:
        """Verify the call's token again at the next `identify` in this context: a
        request on a long-lived stream (a lock Session's) must not ride on the identity
        verified when the stream opened, which may have expired since."""
        _CALL_IDENTITY.set(None)

    async def identify_bearer(self, authorization: str | None) -> Identity:
        """The caller of an HTTP request (the tus endpoint) from its `Authorization: Bearer`
        header, verified as an RPC's token is; UNAUTHENTICATED without a valid one."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("missing bearer token", reason="MISSING_CREDENTIALS")
        await self._tokens.refresh_keys(token)
        return self._tokens.verify(token)

    def identity_of_token(self, text: str) -> Identity | None:
        """Whom `text` would authenticate as a bearer token, else None.

        For input that names a user: `dev-bob` is a token (user `bob`), and a share with
        "user" `dev-bob` would reach nobody. Learns nothing new about a token: the
        caller who holds one can already call with it.
        """
        try:
            return self._tokens.verify(text)
        except Unauthenticated:
            return None

    def require_user(self, context: grpc.aio.ServicerContext) -> Identity:
        """The calling user; services acting without a user are refused."""
        identity = self.identify(context)
        if identity.is_service:
            raise PermissionDenied("this call needs a user credential", reason="USER_REQUIRED")
        return identity

    def require_service(
        self, context: grpc.aio.ServicerContext, allowed: Collection[str] | None = None
    ) -> Identity:
        """A service principal, one of `allowed` when given."""
        identity = self.identify(context)
        if not identity.is_service:
            raise PermissionDenied("this call is for services only", reason="SERVICE_REQUIRED")
        if allowed is not None and identity.service not in allowed:
            raise PermissionDenied(
                f"service {identity.service} may not make this call",
                reason="PRINCIPAL_NOT_ALLOWED",
                principal=identity.service,
            )
        return identity

    def require_ops(self, context: grpc.aio.ServicerContext) -> Identity:
        """An operator: any caller holding the `ops` role (the `ops` principal holds it)."""
        identity = self.identify(context)
        if OPS_ROLE not in identity.roles:
            raise PermissionDenied("this call needs the ops role", reason="OPS_ROLE_REQUIRED")
        return identity
