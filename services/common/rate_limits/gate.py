"""Where the RPC boundary meets the limiter: who the caller is, which keys it spends, and
the refusal it gets.

Service principals (upload's relay calling notify, its merges calling locks, operators)
are never limited: the system must not throttle itself, and their own callers were
limited where they came in. Callers without valid credentials are left to the servicer,
which refuses them with its precise status. A user spends one unit of its own key and one
of its tenant's; when the tenant's refuses, the user's unit goes back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import grpc

from services.common.auth import Authenticator, Identity
from services.common.errors import RateLimited, SerentakError
from services.common.metrics import RATE_LIMITED
from services.common.rate_limits.limiter import Limiter
from services.common.rate_limits.policy import TENANT, USER, RatePolicy, Rule


class MethodRate:
    """The limit of one RPC: its family's limits and keys."""

    def __init__(self, gate: RateGate, rule: Rule) -> None:
        policy = gate.policy
        self._gate = gate
        self.messages = rule.messages
        self.family = rule.family
        limits = policy.families[rule.family]
        self._per_user, self._per_tenant = limits.per_user, limits.per_tenant
        self._prefix = f"{policy.service}:{rule.family}:{policy.window_seconds:g}:"
        self._refused = {
            USER: RATE_LIMITED.labels(policy.service, rule.family, USER),
            TENANT: RATE_LIMITED.labels(policy.service, rule.family, TENANT),
        }

    def caller(self, context: grpc.aio.ServicerContext) -> Identity | None:
        """The user this call is limited as; None: not limited (a service principal, or
        no valid credential, which the servicer refuses)."""
        auth = self._gate.authenticator
        if auth is None:
            return None
        try:
            identity = auth.identify(context)
        except SerentakError:
            return None
        return None if identity.is_service else identity

    async def take(self, caller: Identity) -> None:
        """Spend one unit of `caller`'s and its tenant's keys; RATE_LIMITED (with
        RetryInfo) when either window is full."""
        limiter = self._gate.limiter
        tenant = quote(caller.tenant_id, safe="")
        user_key = None
        if self._per_user:
            user_key = f"{self._prefix}u:{tenant}:{quote(caller.user_id, safe='')}"
            wait = await limiter.take(user_key, self._per_user)
            if wait is not None:
                self._refuse(USER, self._per_user, wait)
        if self._per_tenant:
            wait = await limiter.take(f"{self._prefix}t:{tenant}", self._per_tenant)
            if wait is not None:
                if user_key is not None:
                    limiter.give_back(user_key)
                self._refuse(TENANT, self._per_tenant, wait)

    def _refuse(self, scope: str, limit: int, wait: float) -> None:
        self._refused[scope].inc()
        window = self._gate.policy.window_seconds
        raise RateLimited(
            f"more than {limit} {self.family} calls in {window:g} s by this {scope}",
            retry_after_seconds=max(0.001, wait),
            limit=f"{limit}/{window:g}s",
            family=self.family,
            scope=scope,
        )

    def requests(self, requests: AsyncIterator[Any], caller: Identity) -> AsyncIterator[Any]:
        """`requests` with a unit taken before each message after the first."""
        return _CountedRequests(requests, self, caller)

    async def responses(self, responses: Any, caller: Identity) -> AsyncIterator[Any]:
        """`responses` (an async generator) with a unit taken before each message after
        the first; refused, the handler's generator is closed before the status goes out."""
        first = True
        try:
            async for response in responses:
                if not first:
                    await self.take(caller)
                first = False
                yield response
        finally:
            aclose = getattr(responses, "aclose", None)
            if aclose is not None:
                await aclose()


class _CountedRequests:
    """An async iterator over a request stream that spends a unit per later message."""

    def __init__(self, inner: AsyncIterator[Any], rate: MethodRate, caller: Identity) -> None:
        self._inner = aiter(inner)
        self._rate = rate
        self._caller = caller
        self._first = True

    def __aiter__(self) -> _CountedRequests:
        return self

    async def __anext__(self) -> Any:
        message = await anext(self._inner)
        if self._first:
            self._first = False
        else:
            await self._rate.take(self._caller)
        return message


class RateGate:
    """A service's limits, as the RPC wrapper asks for them per method."""

    def __init__(
        self, policy: RatePolicy, limiter: Limiter, authenticator: Authenticator | None
    ) -> None:
        self.policy = policy
        self.limiter = limiter
        self.authenticator = authenticator

    def for_method(self, full_method: str) -> MethodRate | None:
        """The limit of "/pkg.Service/Method"; None when it has none."""
        rule = self.policy.rule(full_method)
        return MethodRate(self, rule) if rule is not None else None
