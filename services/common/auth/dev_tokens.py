"""dev mode: fixed bearer tokens from the settings' tables (loopback only, `make run`)."""

from __future__ import annotations

import hmac

from services.common.auth.identity import Identity
from services.common.errors import Unauthenticated
from services.common.readiness import Probe


class DevTokens:
    """Maps the dev token tables to identities: users by tenant, services by principal."""

    def __init__(self, users: dict[str, dict[str, str]], services: dict[str, str]) -> None:
        self._users = dict(users)
        self._services = dict(services)

    def verify(self, token: str) -> Identity:
        """The identity `token` stands for; UNAUTHENTICATED/INVALID_CREDENTIALS if none."""
        for known, principal in self._services.items():
            # Constant time: service tokens are the valuable ones.
            if hmac.compare_digest(token.encode(), known.encode()):
                return Identity.for_service(principal)
        entry = self._users.get(token)
        if entry is None:
            raise Unauthenticated("unknown bearer token", reason="INVALID_CREDENTIALS")
        return Identity(tenant_id=entry["tenant_id"], user_id=entry["user_id"])

    async def refresh_keys(self, token: str) -> None:
        """dev tokens have no signing keys to fetch."""

    def probes(self) -> list[Probe]:
        """Nothing to wait for: the tables are in the settings."""
        return []
