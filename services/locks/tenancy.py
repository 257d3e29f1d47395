"""Whose key space a LockService call acts in, decided from its principal.

- A user principal acts only in its own tenant. Naming another tenant (`tenant_id`)
  answers NOT_FOUND, the same as a lock that does not exist, so nothing leaks about
  other tenants; an empty `tenant_id` means its own.
- A service principal (the upload service's merge, ops tools) acts for any tenant, which
  it must name, and only on `file:` keys: services lock files, never a user's scopes.
  Only the principals listed in settings may (default upload and ops): notify has no
  business holding a file's lock, so a leaked notify credential cannot stall merges.

Release/Refresh/Hold therefore need the token *and* the tenant: a token from another
tenant's key space never matches a holder in this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.auth import Identity
from services.common.errors import InvalidArgument
from services.locks.errors import LockNotFound, ServiceKeyForbidden, ServiceNotAllowed

SERVICE_KEY_KIND = "file:"


@dataclass(frozen=True)
class Scope:
    """The tenant a call acts in, and whether per-tenant caps apply to it."""

    tenant: str
    is_service: bool

    @property
    def capped(self) -> bool:
        """Caps bound what users queue up; a service's merges must not be starved by them."""
        return not self.is_service


def scope_for(
    identity: Identity,
    requested_tenant: str,
    key_or_prefix: str | None,
    services: frozenset[str] = frozenset({"upload", "ops"}),
) -> Scope:
    """The tenant `identity` may act in for this request (see the module docstring).

    `key_or_prefix` is the lock key, or the List prefix (None: not known yet); `services`
    the service principals allowed to use locks.
    """
    if identity.is_service:
        if identity.service not in services:
            raise ServiceNotAllowed(
                f"service principal {identity.service} may not use locks",
                principal=identity.service,
            )
        if not requested_tenant:
            raise InvalidArgument("tenant_id", "is required when a service acts on a lock")
        if key_or_prefix is not None and not _service_may_use(key_or_prefix):
            raise ServiceKeyForbidden(
                "service principals may lock only file: keys", key=key_or_prefix
            )
        return Scope(requested_tenant, is_service=True)
    if requested_tenant and requested_tenant != identity.tenant_id:
        raise LockNotFound("no such lock")
    return Scope(identity.tenant_id, is_service=False)


def service_list_prefix(prefix: str) -> str:
    """A service's List sees `file:` keys only: an empty prefix means `file:`."""
    return prefix if prefix.startswith(SERVICE_KEY_KIND) else SERVICE_KEY_KIND


def _service_may_use(key_or_prefix: str) -> bool:
    # A List prefix may stop before the colon ("fi"): it still selects file: keys only
    # once narrowed by service_list_prefix.
    return key_or_prefix.startswith(SERVICE_KEY_KIND) or SERVICE_KEY_KIND.startswith(key_or_prefix)
