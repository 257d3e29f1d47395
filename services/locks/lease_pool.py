"""Leases granted ahead of the acquires that will need them.

An uncontended Acquire is a lease grant, then the claim transaction. The grant depends
on nothing in the request but its TTL, so while acquires with one TTL keep coming (the
previous one less than `max_age` ago) the pool grants the next lease for that TTL in the
background, and the next acquire starts with its claim: one etcd round trip on the
request's path instead of two. At a slower pace nothing is granted ahead (no lease is
wasted).

A lock's TTL runs from its lease's grant, and the Lock's `expires_at` says so. A spare is
used only within `max_age` of its grant (at most a tenth of its TTL), so a lock never
starts with less than 90% of its TTL; an unused spare is revoked once it is too old.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from services.locks.etcd_client import Etcd

MAX_AGE_SECONDS = 0.5  # how old a spare lease may be when it is handed out
MAX_TTLS = 16  # distinct TTLs kept warm at once (the least recently used is dropped)


@dataclass(frozen=True)
class Lease:
    """A granted lease: its id and when it was granted (wall clock)."""

    id: int
    granted_at: float
    granted_mono: float


class LeasePool:
    """Hands out leases; keeps one spare per busy TTL."""

    def __init__(self, etcd: Etcd, max_age: float = MAX_AGE_SECONDS) -> None:
        self.etcd = etcd
        self.max_age = max_age
        self._spares: dict[int, Lease] = {}
        self._last_take: dict[int, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._refilling: set[int] = set()
        self.spares_used = 0  # observable for tests and tools

    def _age_limit(self, ttl: int) -> float:
        return min(self.max_age, ttl / 10)

    async def take(self, ttl: int) -> Lease:
        """A lease with `ttl` seconds: a fresh spare if there is one, else granted now."""
        now = time.monotonic()
        last = self._last_take.pop(ttl, None)
        self._last_take[ttl] = now  # most recently used last
        busy = last is not None and now - last <= self._age_limit(ttl)
        spare = self._spares.pop(ttl, None)
        if busy:
            self._refill(ttl)
        if spare is not None:
            if now - spare.granted_mono <= self._age_limit(ttl):
                self.spares_used += 1
                return spare
            self._revoke(spare.id)
        return await self._grant(ttl)

    async def _grant(self, ttl: int) -> Lease:
        lease_id = await self.etcd.grant_lease(ttl)
        return Lease(lease_id, time.time(), time.monotonic())

    def _refill(self, ttl: int) -> None:
        if ttl in self._refilling:
            return
        while len(self._last_take) > MAX_TTLS:
            oldest = next(iter(self._last_take))
            del self._last_take[oldest]
            dropped = self._spares.pop(oldest, None)
            if dropped is not None:
                self._revoke(dropped.id)
        self._refilling.add(ttl)
        self._spawn(self._make_spare(ttl))

    async def _make_spare(self, ttl: int) -> None:
        try:
            lease = await self._grant(ttl)
        except Exception:
            return  # etcd is away: the next acquire grants (and reports) on its own path
        finally:
            self._refilling.discard(ttl)
        old = self._spares.pop(ttl, None)
        if old is not None:
            self._revoke(old.id)
        self._spares[ttl] = lease
        # Not taken in time: revoke it rather than leave a keyless lease for a whole TTL.
        await asyncio.sleep(self._age_limit(ttl))  # the spare's shelf life, not a sync point
        if self._spares.get(ttl) is lease:
            del self._spares[ttl]
            await self._revoke_now(lease.id)

    def _revoke(self, lease_id: int) -> None:
        self._spawn(self._revoke_now(lease_id))

    async def _revoke_now(self, lease_id: int) -> None:
        # Best effort: a lease without keys that is not revoked expires by itself.
        with contextlib.suppress(Exception):
            await self.etcd.revoke_lease(lease_id)

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop granting ahead; revoke the spares (bounded: etcd may be away)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        spares, self._spares = list(self._spares.values()), {}
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await asyncio.gather(*(self._revoke_now(s.id) for s in spares))
