"""Who may touch which lock: the caller's tenant, its key space, and the holder's identity.

Tenants. A user principal acts only in its own tenant. Naming another tenant
(`tenant_id`) answers NOT_FOUND, the same as a lock that does not exist, so nothing leaks
about other tenants; an empty `tenant_id` means its own. A service principal acts for any
tenant, which it must name. Only the service principals listed in settings may use locks
at all (default upload and ops): notify has no business holding a file's lock, so a leaked
notify credential cannot stall merges (SERVICE_NOT_ALLOWED).

Keys. `file:{file_id}` keys are the merge's: the services that merge (upload) and
operators (the `ops` principal, or a user holding the `ops` role) take them, never a
user, so no user can stall another's merges (FILE_KEY_FORBIDDEN). A user's keys live in
its own space, `user:{self}:{scope}`; naming another user's space is refused
(USER_KEY_FORBIDDEN) on every RPC, except that an operator may read it (Describe, List).
A user's List without a prefix lists its own space. Services lock only `file:` keys
(SERVICE_KEY_FORBIDDEN); their List without a prefix lists `file:` keys.

Holders. Each lock records the principal that acquired it (`user:{id}` or
`service:{name}`; the tenant is the key space's). Release, Refresh and Hold need that same
principal *and* the token, in that tenant: anyone else's attempt is answered as a stale
token would be (`released=false`, LOCK_LOST, NOT_HOLDER), which tells nothing about the
lock. A lock taken before principals were recorded (a replica of an older version, during
a rolling upgrade) is bound to tenant and token only, until it ends. Who holds a lock
(token, owner, lease, correlation id, principal, and the same of its waiters, whose create
revisions are their future tokens) is shown only to that holder's principal and to
operators; anyone else sees that it is held and until when. A LOCK_HELD refusal never
carries a token, and names the holder's owner only to those who may see it.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.auth import OPS_ROLE, Identity
from services.common.errors import InvalidArgument
from services.locks.errors import (
    FileKeyForbidden,
    LockNotFound,
    ServiceKeyForbidden,
    ServiceNotAllowed,
    UserKeyForbidden,
)
from services.locks.lock_views import Caller

FILE_KEYS = "file:"
USER_KEYS = "user:"


@dataclass(frozen=True)
class Scope:
    """The tenant a call acts in, and on whose authority (see the module docstring)."""

    tenant: str
    is_service: bool
    caller: Caller  # the principal recorded with a lock, and whether it is an operator
    user_id: str = ""  # a user's id ("" for a service)

    @property
    def capped(self) -> bool:
        """Caps bound what users queue up; a service's merges must not be starved by them."""
        return not self.is_service

    @property
    def own_space(self) -> str:
        """A user's own key space, `user:{self}:`."""
        return f"{USER_KEYS}{self.user_id}:"

    def check_key(self, key: str, *, reading: bool = False) -> None:
        """Refuse `key` unless this caller may name it (`reading`: Describe, not a change).

        Only the kind of key is judged here; a malformed key is left to `KeySpace`
        (INVALID_LOCK_KEY).
        """
        if self.is_service:
            if not key.startswith(FILE_KEYS):
                raise ServiceKeyForbidden("service principals may lock only file: keys", key=key)
            return
        if key.startswith(FILE_KEYS):
            if not self.caller.operator:
                raise FileKeyForbidden(
                    f"file: keys are the merge's; lock in your own space {self.own_space}{{scope}}",
                    key=key,
                )
        elif key.startswith(USER_KEYS) and not key.startswith(self.own_space):
            if not (reading and self.caller.operator):
                raise UserKeyForbidden(
                    f"another user's key space; yours is {self.own_space}{{scope}}", key=key
                )

    def list_prefix(self, prefix: str) -> str:
        """The prefix List reads for this caller: narrowed to the space it may see.

        A service sees `file:` keys, a user its own space (an empty or shorter prefix is
        narrowed to it), an operator user its whole tenant; any other prefix is refused.
        """
        if self.is_service:
            if prefix.startswith(FILE_KEYS):
                return prefix
            if FILE_KEYS.startswith(prefix):
                return FILE_KEYS
            raise ServiceKeyForbidden("service principals may list only file: keys", key=prefix)
        if self.caller.operator or prefix.startswith(self.own_space):
            return prefix
        if self.own_space.startswith(prefix):
            return self.own_space
        if prefix.startswith(FILE_KEYS) or FILE_KEYS.startswith(prefix):
            raise FileKeyForbidden("file: keys are the merge's", key=prefix)
        raise UserKeyForbidden(
            f"another user's key space; yours is {self.own_space}{{scope}}", key=prefix
        )


def scope_for(
    identity: Identity,
    requested_tenant: str,
    services: frozenset[str] = frozenset({"upload", "ops"}),
) -> Scope:
    """The tenant `identity` may act in for this request (see the module docstring);
    `services` the service principals allowed to use locks."""
    operator = OPS_ROLE in identity.roles
    if identity.is_service:
        if identity.service not in services:
            raise ServiceNotAllowed(
                f"service principal {identity.service} may not use locks",
                principal=identity.service,
            )
        if not requested_tenant:
            raise InvalidArgument("tenant_id", "is required when a service acts on a lock")
        return Scope(requested_tenant, True, Caller(f"service:{identity.service}", operator))
    if requested_tenant and requested_tenant != identity.tenant_id:
        raise LockNotFound("no such lock")
    caller = Caller(f"user:{identity.user_id}", operator)
    return Scope(identity.tenant_id, False, caller, identity.user_id)
