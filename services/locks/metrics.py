"""Prometheus metrics of the lock service, one line of description each."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LOCK_WAIT_SECONDS = Histogram(
    "serentak_lock_wait_seconds",
    "Time an Acquire spent before it got the lock or gave up, by outcome and key pattern.",
    ["outcome", "pattern"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LOCK_CONTENTION = Counter(
    "serentak_lock_contention_total",
    "Acquires that found the lock held: outcome=waited (then got it) or failed; by key pattern.",
    ["outcome", "pattern"],
)
STALE_LOCK_RECOVERIES = Counter(
    "serentak_lock_stale_recoveries_total",
    "Locks handed to a waiter after the previous contender's lease expired.",
)
LOCKS_HELD = Gauge(
    "serentak_locks_held",
    "Locks this process keeps alive right now (open Hold streams).",
)
LEASES_TO_REVOKE = Gauge(
    "serentak_lock_leases_to_revoke",
    "Leases declared lost while etcd was unreachable, still waiting to be revoked.",
)
ETCD_FAILOVERS = Counter(
    "serentak_etcd_failovers_total",
    "Calls moved to another etcd member because the one in use did not serve them.",
)
ETCD_AUTHENTICATIONS = Counter(
    "serentak_etcd_authentications_total",
    "etcd auth tokens obtained (the first, then one per refusal: expiry, member restart).",
)
LOCK_RENEWALS = Counter(
    "serentak_lock_renewals_total",
    "Lease renewals a Hold made (each extends a held lock by its TTL).",
)
HOLDS_CAPPED = Counter(
    "serentak_lock_max_hold_exceeded_total",
    "Holds ended because the lock was held past SERENTAK_LOCK_MAX_HOLD_SECONDS.",
)
LEASE_GRANTS = Counter(
    "serentak_lock_lease_grants_total",
    "Leases granted for locks: where=request (on an Acquire's path) or ahead (a spare).",
    ["where"],
)
LEASES_REUSED = Counter(
    "serentak_lock_leases_reused_total",
    "Acquires that got a released lock's lease back instead of a new grant.",
)
