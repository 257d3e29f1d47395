"""What a service limits: its RPC families, their limits per user and per tenant, and
which RPCs belong to which family."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

USER, TENANT = "user", "tenant"


@dataclass(frozen=True)
class FamilyLimits:
    """Units one user, and one tenant's users together, may spend per window (0: none)."""

    per_user: int
    per_tenant: int


@dataclass(frozen=True)
class Rule:
    """One RPC's family; `messages`: each stream message after the first costs a unit too
    (the call's own unit pays for the first), so N chunks on one UploadChunks stream cost
    what N PutChunk calls do."""

    family: str
    messages: bool = False


@dataclass(frozen=True)
class RatePolicy:
    """One service's limits: `rules` by method name (without the service), `families`
    by family name, all over windows of `window_seconds`."""

    service: str
    window_seconds: float
    families: Mapping[str, FamilyLimits]
    rules: Mapping[str, Rule] = field(default_factory=dict)

    def rule(self, full_method: str) -> Rule | None:
        """The rule of "/pkg.Service/Method", if that method is limited."""
        rule = self.rules.get(full_method.rpartition("/")[2])
        if rule is None:
            return None
        limits = self.families[rule.family]
        return rule if limits.per_user or limits.per_tenant else None
