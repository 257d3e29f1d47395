"""gRPC surface of `serentak.locks.v1.LockService`: who, where, validate, call, convert.

Every RPC first identifies its principal (UNAUTHENTICATED without one), decides the
tenant key space it acts in (`tenancy.scope_for`) and whether it may name the key
(`Scope.check_key`); only then does it touch etcd, on that principal's authority.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc

from services.common.auth import Authenticator
from services.common.correlation import current_correlation_id
from services.common.rate_limits import RateGate
from services.common.tasks import finish
from services.locks.caps import TenantCaps
from services.locks.hold import HoldEvent, Holding, Lost
from services.locks.keys import (
    LockKey,
    check_owner,
    check_token,
    check_ttl,
    check_wait_timeout,
)
from services.locks.lock_views import LockState, LockView
from services.locks.metrics import LOCKS_HELD
from services.locks.mutex import Admission, Mutex
from services.locks.paging import decode_token, encode_token, page_size
from services.locks.session import SESSION, LockSession
from services.locks.tenancy import Scope, scope_for


class LockServicer(locks_pb2_grpc.LockServiceServicer):
    """Thin: every decision lives in `Mutex` and `Holding`."""

    def __init__(
        self,
        mutex: Mutex,
        call_timeout: float,
        auth: Authenticator,
        caps: TenantCaps,
        list_limit: int = 100,
        list_max: int = 1000,
        services: frozenset[str] = frozenset({"upload", "ops"}),
        max_hold_seconds: float | None = None,
        session_max_in_flight: int = 64,
        rates: RateGate | None = None,
    ) -> None:
        # A Session's requests are each counted like their unary RPC (rate_families.py).
        self.session_rates = {
            op: rate
            for op in ("acquire", "refresh", "release")
            if rates is not None
            and (rate := rates.for_method(SESSION.rsplit("/", 1)[0] + "/" + op.capitalize()))
        }
        self.max_hold_seconds = max_hold_seconds
        self.session_max_in_flight = session_max_in_flight
        self.mutex = mutex
        self.keys = mutex.keys
        self.call_timeout = call_timeout
        self.auth = auth
        self.caps = caps
        self.list_limit = list_limit
        self.list_max = list_max
        self.services = services

    def _locate(
        self, context: grpc.aio.ServicerContext, key: str, tenant_id: str, reading: bool = False
    ) -> tuple[LockKey, Scope]:
        """The caller's principal and tenant, then the lock key in that tenant's space, if
        the caller may name it (`reading`: Describe)."""
        scope = scope_for(self.auth.identify(context), tenant_id, self.services)
        lock_key = self.keys.lock_key(key, scope.tenant)
        scope.check_key(key, reading=reading)
        return lock_key, scope

    async def Acquire(
        self, request: locks_pb2.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> locks_pb2.Lock:
        key, scope = self._locate(context, request.key, request.tenant_id)
        owner = check_owner(request.owner)
        ttl = check_ttl(request.ttl_seconds)
        wait = check_wait_timeout(request.wait_timeout_ms)

        async def check(my_revision: int, is_holder: bool, keys: list[bytes] | None) -> None:
            await self.caps.admit(scope.tenant, my_revision, is_holder, keys)

        admit = Admission(self.keys.tenant_root(scope.tenant), check) if scope.capped else None
        view = await self.mutex.acquire(
            key, owner, ttl, wait, current_correlation_id(), admit, caller=scope.caller
        )
        return lock_pb(view)

    async def Refresh(
        self, request: locks_pb2.RefreshRequest, context: grpc.aio.ServicerContext
    ) -> locks_pb2.Lock:
        key, scope = self._locate(context, request.key, request.tenant_id)
        return lock_pb(await self.mutex.refresh(key, check_token(request.token), scope.caller))

    async def Release(
        self, request: locks_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> locks_pb2.ReleaseResponse:
        key, scope = self._locate(context, request.key, request.tenant_id)
        released = await self.mutex.release(key, check_token(request.token), scope.caller)
        return locks_pb2.ReleaseResponse(released=released)

    async def Describe(
        self, request: locks_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> locks_pb2.DescribeResponse:
        key, scope = self._locate(context, request.key, request.tenant_id, reading=True)
        return describe_pb((await self.mutex.describe(key)).seen_by(scope.caller))

    async def List(
        self, request: locks_pb2.ListRequest, context: grpc.aio.ServicerContext
    ) -> locks_pb2.ListResponse:
        scope = scope_for(self.auth.identify(context), request.tenant_id, self.services)
        self.keys.list_prefix(request.prefix, scope.tenant)  # a malformed prefix: INVALID first
        prefix = scope.list_prefix(request.prefix)
        size = page_size(request.page_size, request.limit, self.list_limit, self.list_max)
        range_prefix = self.keys.list_prefix(prefix, scope.tenant)
        after = decode_token(request.page_token, prefix)
        states, last = await self.mutex.list_page(
            self.keys.tenant_root(scope.tenant), range_prefix, after, size
        )
        return locks_pb2.ListResponse(
            locks=[describe_pb(s.seen_by(scope.caller)) for s in states],
            next_page_token=encode_token(last, prefix) if last is not None else "",
        )

    async def Hold(
        self,
        request_iterator: AsyncIterator[locks_pb2.HoldRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[locks_pb2.HoldEvent]:
        # Refuse an anonymous caller before reading anything it sends.
        self.auth.identify(context)
        first = await anext(aiter(request_iterator), None)
        if first is None:
            return
        key, scope = self._locate(context, first.key, first.tenant_id)
        holding = Holding(
            self.mutex,
            key,
            check_token(first.token),
            scope.caller,
            self.call_timeout,
            self.max_hold_seconds,
        )
        # The client closing its side ends the hold: read (and ignore) pings until then.
        client_done = asyncio.create_task(_drain(request_iterator))
        next_event: asyncio.Task[HoldEvent] | None = None
        LOCKS_HELD.inc()
        try:
            await holding.start()
            while True:
                next_event = asyncio.create_task(holding.events.get())
                await asyncio.wait({next_event, client_done}, return_when=asyncio.FIRST_COMPLETED)
                if not next_event.done():
                    return
                event = next_event.result()
                if isinstance(event, Lost):
                    yield locks_pb2.HoldEvent(
                        lost=locks_pb2.Lost(
                            reason=f"LOST_REASON_{event.reason.name}",  # type: ignore[arg-type]
                            detail=event.detail,
                        )
                    )
                    return
                yield locks_pb2.HoldEvent(held=lock_pb(event))
        finally:
            # Every exit (half-close, loss, the client's cancel, the generator closed at a
            # `yield`) ends both tasks and the hold's own; none is left to the collector.
            LOCKS_HELD.dec()
            await finish(next_event, client_done)
            await holding.close()

    async def Session(  # type: ignore[override]  # answers by context.write, from its tasks
        self,
        request_iterator: AsyncIterator[locks_pb2.SessionRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        # Refuse an anonymous caller before reading anything it sends; every request is
        # then identified again (the unary method's own check) with the stream's credential.
        self.auth.identify(context)
        session = LockSession(
            context,
            self.Acquire,
            self.Refresh,
            self.Release,
            self.session_max_in_flight,
            self.session_rates,
        )
        await session.serve(request_iterator)


async def _drain(requests: AsyncIterator[locks_pb2.HoldRequest]) -> None:
    async for _ in requests:
        pass


def _ts(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def lock_pb(view: LockView) -> locks_pb2.Lock:
    """The `Lock` message for a holder."""
    return locks_pb2.Lock(
        key=view.key,
        token=view.token,
        owner=view.owner,
        lease_id=view.lease_id,
        acquired_at=_ts(view.acquired_at),
        expires_at=_ts(view.expires_at),
        correlation_id=view.correlation_id,
        ttl_seconds=view.ttl_seconds,
        principal=view.principal,
    )


def describe_pb(state: LockState) -> locks_pb2.DescribeResponse:
    """The `DescribeResponse` for one lock's holder and waiters (already `seen_by` the
    caller: hidden fields are left empty)."""
    if state.holder is None:
        return locks_pb2.DescribeResponse(held=False)
    return locks_pb2.DescribeResponse(
        held=True,
        lock=lock_pb(state.holder),
        waiters=[
            locks_pb2.Waiter(
                owner=w.owner,
                create_revision=w.create_revision,
                lease_id=w.lease_id,
                waiting_since=_ts(w.waiting_since),
                correlation_id=w.correlation_id,
                principal=w.principal,
            )
            for w in state.waiters
        ],
    )
