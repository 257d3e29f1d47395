"""Who is calling one RPC: a user of a tenant, or a service principal."""

from __future__ import annotations

from dataclasses import dataclass, field

# Service principals: each service calls the others as itself; `ops` is the operator.
UPLOAD, NOTIFY, LOCKS, OPS = "upload", "notify", "locks", "ops"
PRINCIPALS = frozenset({UPLOAD, NOTIFY, LOCKS, OPS})
OPS_ROLE = "ops"


@dataclass(frozen=True, slots=True)
class Identity:
    """The caller of one RPC.

    A user has a `tenant_id` and `user_id`; a service principal has `service` set (its
    name, e.g. `upload`), `is_service` true and empty tenant/user: it acts across tenants.
    `roles` come from the token (jwt) or the principal (a service holds its own name).
    """

    tenant_id: str
    user_id: str
    is_service: bool = False
    service: str | None = None
    roles: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def for_service(cls, principal: str, roles: frozenset[str] = frozenset()) -> Identity:
        """A service principal; it holds the role of its own name (so `ops` is an operator)."""
        return cls(
            tenant_id="", user_id="", is_service=True, service=principal, roles=roles | {principal}
        )
