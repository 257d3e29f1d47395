"""Capacity by kind of caller, so that user streams never starve service calls.

grpc's own `maximum_concurrent_rpcs` counts every call alike: 1,000 open Subscribe streams
made the upload relay's IngestBatch fail with RESOURCE_EXHAUSTED (issue 37). This gate
counts each call against the pool of its caller instead, in the RPC wrapper
(rpc_wrapper.py), once the caller is known:

- service principals (Ingest, IngestBatch, admin): `service_calls` calls at once,
  whatever users hold;
- users' calls with one response (and callers without valid credentials, as one
  anonymous user): `user_calls` at once;
- users' response streams: `streams_per_user` per user, `streams_per_tenant` per tenant
  and `streams` in all.

A call past a cap is RESOURCE_EXHAUSTED with the cap's ErrorInfo reason (`REASONS`) and a
`google.rpc.RetryInfo` (the cap's delay plus up to half again at random, so refused
clients do not all come back at once). A slot is taken before the handler runs and given
back exactly once when the call ends. Counts live in the process: every cap is one
replica's, and the client-side balancer spreads streams over the replicas.

The tenant and user caps keep a count per key and a count of keys per count, so both the
check and the "most streams any one tenant holds" metric cost O(1) per open and close.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

import grpc

from services.common.auth import Authenticator, Identity
from services.common.errors import CapacityExhausted, SerentakError
from services.common.metrics import CAPACITY_IN_USE, CAPACITY_LIMIT, CAPACITY_REFUSED

SERVICE_CALLS, USER_CALLS = "service_calls", "user_calls"
STREAMS, TENANT_STREAMS, USER_STREAMS = "streams", "tenant_streams", "user_streams"
REASONS = {
    SERVICE_CALLS: "CALL_LIMIT_SERVICES",
    USER_CALLS: "CALL_LIMIT_USERS",
    STREAMS: "STREAM_LIMIT_SERVER",
    TENANT_STREAMS: "STREAM_LIMIT_TENANT",
    USER_STREAMS: "STREAM_LIMIT_USER",
}
# The key callers without valid credentials share (their call is refused by the
# servicer anyway; health Watch and reflection streams need none).
ANONYMOUS = Identity(tenant_id="", user_id="")


@dataclass(frozen=True)
class CapacityLimits:
    """The size of each cap, and the RetryInfo delays of a refused call and stream."""

    service_calls: int
    user_calls: int
    streams: int
    streams_per_tenant: int
    streams_per_user: int
    call_retry_seconds: float = 1.0
    stream_retry_seconds: float = 10.0


class _PerKey:
    """Open streams per key (tenant or user), with the largest count kept in O(1)."""

    def __init__(self) -> None:
        self.counts: dict[Hashable, int] = {}
        self._keys_at: Counter[int] = Counter()
        self.peak = 0

    def get(self, key: Hashable) -> int:
        return self.counts.get(key, 0)

    def add(self, key: Hashable) -> None:
        n = self.counts.get(key, 0) + 1
        self.counts[key] = n
        if n > 1:
            self._keys_at[n - 1] -= 1
        self._keys_at[n] += 1
        self.peak = max(self.peak, n)

    def remove(self, key: Hashable) -> None:
        n = self.counts[key]
        self._keys_at[n] -= 1
        if n > 1:
            self.counts[key] = n - 1
            self._keys_at[n - 1] += 1
        else:
            del self.counts[key]
        # The key that left the peak now sits one below it (or no key is left).
        if n == self.peak and self._keys_at[n] <= 0:
            self.peak = n - 1


class Slot:
    """One admitted call's place; `release` gives it back (idempotent)."""

    __slots__ = ("_capacity", "_identity", "_pool")

    def __init__(self, capacity: CallCapacity, pool: str, identity: Identity) -> None:
        self._capacity: CallCapacity | None = capacity
        self._pool = pool
        self._identity = identity

    def release(self) -> None:
        """Give the slot back; later calls do nothing."""
        capacity, self._capacity = self._capacity, None
        if capacity is not None:
            capacity._release(self._pool, self._identity)


class CallCapacity:
    """The pools and stream caps of one server (see the module docstring)."""

    def __init__(self, limits: CapacityLimits) -> None:
        self.limits = limits
        self._calls = {SERVICE_CALLS: 0, USER_CALLS: 0}
        self._streams = 0
        self._tenants = _PerKey()
        self._users = _PerKey()
        caps = {
            SERVICE_CALLS: limits.service_calls,
            USER_CALLS: limits.user_calls,
            STREAMS: limits.streams,
            TENANT_STREAMS: limits.streams_per_tenant,
            USER_STREAMS: limits.streams_per_user,
        }
        for cap, size in caps.items():
            CAPACITY_LIMIT.labels(cap).set(size)
            CAPACITY_REFUSED.labels(cap)  # exported at 0 from the start, for rate()
        self._in_use = {cap: CAPACITY_IN_USE.labels(cap) for cap in caps}
        self._report()

    def admit(self, identity: Identity | None, *, stream: bool) -> Slot:
        """A slot for one call of `identity` (None: anonymous); `stream`: the call has a
        response stream. Raises CapacityExhausted, taking nothing, when a cap is full."""
        identity = identity or ANONYMOUS
        if identity.is_service:
            pool = SERVICE_CALLS
        elif stream:
            self._check_streams(identity)
            pool = STREAMS
        else:
            pool = USER_CALLS
        if pool != STREAMS:
            limit = self.limits.service_calls if pool == SERVICE_CALLS else self.limits.user_calls
            if self._calls[pool] >= limit:
                self._refuse(pool, limit, f"{limit} calls of this kind are running")
            self._calls[pool] += 1
        else:
            self._streams += 1
            self._tenants.add(identity.tenant_id)
            self._users.add((identity.tenant_id, identity.user_id))
        self._report()
        return Slot(self, pool, identity)

    def open_streams(self, identity: Identity) -> int:
        """How many streams `identity` holds open here."""
        return self._users.get((identity.tenant_id, identity.user_id))

    def _check_streams(self, identity: Identity) -> None:
        limits = self.limits
        if self._users.get((identity.tenant_id, identity.user_id)) >= limits.streams_per_user:
            self._refuse(
                USER_STREAMS,
                limits.streams_per_user,
                f"this user has {limits.streams_per_user} streams open; close one",
            )
        if self._tenants.get(identity.tenant_id) >= limits.streams_per_tenant:
            self._refuse(
                TENANT_STREAMS,
                limits.streams_per_tenant,
                f"this tenant has {limits.streams_per_tenant} streams open on this replica",
            )
        if self._streams >= limits.streams:
            self._refuse(STREAMS, limits.streams, f"{limits.streams} streams are open here")

    def _refuse(self, cap: str, limit: int, message: str) -> None:
        CAPACITY_REFUSED.labels(cap).inc()
        base = (
            self.limits.call_retry_seconds
            if cap in (SERVICE_CALLS, USER_CALLS)
            else self.limits.stream_retry_seconds
        )
        raise CapacityExhausted(
            message,
            reason=REASONS[cap],
            cap=cap,
            limit=limit,
            retry_after_seconds=base * (1 + random.random() / 2),
        )

    def _release(self, pool: str, identity: Identity) -> None:
        if pool == STREAMS:
            self._streams -= 1
            self._tenants.remove(identity.tenant_id)
            self._users.remove((identity.tenant_id, identity.user_id))
        else:
            self._calls[pool] -= 1
        self._report()

    def _report(self) -> None:
        in_use = self._in_use
        in_use[SERVICE_CALLS].set(self._calls[SERVICE_CALLS])
        in_use[USER_CALLS].set(self._calls[USER_CALLS])
        in_use[STREAMS].set(self._streams)
        in_use[TENANT_STREAMS].set(self._tenants.peak)
        in_use[USER_STREAMS].set(self._users.peak)


class CapacityGate:
    """What the RPC wrapper asks: identifies the caller, then admits it to `capacity`."""

    def __init__(self, capacity: CallCapacity, authenticator: Authenticator | None) -> None:
        self.capacity = capacity
        self._auth = authenticator

    def admit(self, context: grpc.aio.ServicerContext, *, stream: bool) -> Slot:
        """A slot for this call (see `CallCapacity.admit`)."""
        identity = None
        if self._auth is not None:
            try:
                identity = self._auth.identify(context)
            except SerentakError:
                identity = None  # refused by the servicer with its precise reason
        return self.capacity.admit(identity, stream=stream)
