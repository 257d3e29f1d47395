"""Settings of the lock service."""

from __future__ import annotations

from pydantic import Field

from services.common.config import CommonSettings


class LocksSettings(CommonSettings):
    """Read once at start-up from `SERENTAK_*`."""

    locks_max_message_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request accepted (keys, owners: small).",
    )
    lock_prefix: str = Field("/serentak/locks/", description="etcd key prefix for all locks.")
    etcd_call_timeout_seconds: float = Field(
        5.0, gt=0, description="Longest wait for one etcd request before answering UNAVAILABLE."
    )
    lock_max_hold_seconds: float = Field(
        3600.0,
        gt=0,
        description="Longest total time one lock may be held; past it Hold ends with"
        " LOST_REASON_MAX_HOLD_EXCEEDED and the lock is released.",
    )
    lock_list_limit: int = Field(100, gt=0, description="List answers this many locks by default.")
    lock_list_max: int = Field(1000, gt=0, description="List never answers more locks than this.")
    lock_service_principals: frozenset[str] = Field(
        frozenset({"upload", "ops"}),
        description="Service principals that may lock tenants' file: keys (JSON list).",
    )
    lock_max_held_per_tenant: int = Field(
        1000, gt=0, description="Locks a tenant's users may hold at once (RESOURCE_EXHAUSTED)."
    )
    lock_max_waiters_per_tenant: int = Field(
        1000, gt=0, description="Waiters a tenant's users may queue at once (RESOURCE_EXHAUSTED)."
    )
    # Rate limits per window (SERENTAK_RATE_LIMIT_WINDOW_SECONDS), counted in etcd over all
    # replicas (services/locks/rate_families.py); 0: none. Service principals (upload's
    # merges) are never limited.
    rate_limit_acquire_per_user: int = Field(
        3000,
        ge=0,
        description="Acquire calls, Session streams and Session acquires one user may make "
        "per window (a refused Session request is answered RATE_LIMITED; the stream stays).",
    )
    rate_limit_acquire_per_tenant: int = Field(
        30000, ge=0, description="Acquires of one tenant's users together per window."
    )
    rate_limit_lock_calls_per_user: int = Field(
        6000,
        ge=0,
        description="Refresh, Release, Describe, List and Hold calls (and Session refreshes "
        "and releases) one user may make per window.",
    )
    rate_limit_lock_calls_per_tenant: int = Field(
        60000, ge=0, description="Those calls of one tenant's users together per window."
    )
    lock_session_max_in_flight: int = Field(
        64,
        gt=0,
        le=10_000,
        description="Requests one Session stream may have running at once; past it a request"
        " is answered RESOURCE_EXHAUSTED / SESSION_IN_FLIGHT_LIMIT.",
    )
