"""The lock service's RPC families and their limits (services/common/rate_limits/).

Acquire is the expensive call (etcd writes, a waiter's watch); a Session stream costs
its call, and each of its requests is counted by the session itself with the family of
its operation, so a refused request is that request's RATE_LIMITED answer and the stream
stays open (session.py). Service principals (upload's merges) are never limited.
"""

from __future__ import annotations

from services.common.rate_limits import FamilyLimits, RatePolicy, Rule
from services.locks.settings import LocksSettings

ACQUIRE, LOCK_CALLS = "acquire", "lock_calls"

RULES = {
    "Acquire": Rule(ACQUIRE),
    "Session": Rule(ACQUIRE),
    "Refresh": Rule(LOCK_CALLS),
    "Release": Rule(LOCK_CALLS),
    "Describe": Rule(LOCK_CALLS),
    "List": Rule(LOCK_CALLS),
    # Its later messages are optional pings the server only reads: the call is the cost.
    "Hold": Rule(LOCK_CALLS),
}


def rate_policy(settings: LocksSettings) -> RatePolicy:
    """The lock service's limits as configured in `settings`."""
    return RatePolicy(
        service="locks",
        window_seconds=settings.rate_limit_window_seconds,
        families={
            ACQUIRE: FamilyLimits(
                settings.rate_limit_acquire_per_user, settings.rate_limit_acquire_per_tenant
            ),
            LOCK_CALLS: FamilyLimits(
                settings.rate_limit_lock_calls_per_user, settings.rate_limit_lock_calls_per_tenant
            ),
        },
        rules=RULES,
    )
