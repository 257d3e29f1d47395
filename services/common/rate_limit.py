"""Per-caller rate limits on expensive RPCs, with the `limits` library (moving window).

Each (RPC, tenant, user) has its own windows, e.g. "600/minute;10000/hour": a call past
any of them is RESOURCE_EXHAUSTED / RATE_LIMITED with a `google.rpc.RetryInfo` saying when
the oldest call in that window leaves it. The counters live in the process (one replica's
view); a shared `limits` storage (Redis) would make them deployment-wide.
"""

from __future__ import annotations

import time

from limits import RateLimitItem, parse_many
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from services.common.auth import Identity
from services.common.errors import RateLimited
from services.common.metrics import RATE_LIMITED


class RateLimiter:
    """Checks and counts one call of an RPC by a caller against every configured window."""

    def __init__(self, spec: str) -> None:
        # Parsed at start-up: a bad spec fails the service's start, not a call.
        self._items: list[RateLimitItem] = parse_many(spec) if spec.strip() else []
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    async def check(self, identity: Identity, rpc: str) -> None:
        """Count one `rpc` call by `identity`; RATE_LIMITED (no count) when a window is full."""
        key = (rpc, identity.tenant_id, identity.user_id)
        for item in self._items:
            if not await self._limiter.test(item, *key):
                stats = await self._limiter.get_window_stats(item, *key)
                RATE_LIMITED.labels(rpc).inc()
                raise RateLimited(
                    f"more than {item} {rpc} calls",
                    retry_after_seconds=max(0.001, stats.reset_time - time.time()),
                    limit=str(item),
                )
        for item in self._items:
            await self._limiter.hit(item, *key)
