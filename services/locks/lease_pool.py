"""Leases granted ahead of the acquires that will need them, and reused after releases.

An uncontended Acquire is a lease grant, then the claim transaction. The grant depends
on nothing in the request but its TTL, so while acquires with one TTL keep coming (the
previous one less than `max_age` ago) the pool grants the next lease for that TTL in the
background, and the next acquire starts with its claim: one etcd round trip on the
request's path instead of two. At a slower pace nothing is granted ahead (no lease is
wasted).

A lock's TTL runs from its lease's grant, and the Lock's `expires_at` says so (the grant
time is taken before the grant is sent, so etcd's expiry is never earlier). A lease is
handed out only within `max_age` of its grant (at most a tenth of its TTL), so a lock
never starts with less than 90% of its TTL.

Reuse: a lease whose lock was released (its only key deleted by the release itself,
never renewed; `Mutex` decides) comes back with `give_back`, keeping its ORIGINAL grant
time, so the same `max_age` rule applies to it. A steady stream of acquire/release pairs
then needs one grant per `max_age`, not one per lock. A spare nobody took in time is
revoked if it never had a key; a given-back lease is only dropped, never revoked: it
expires by itself, so "the predecessor's lease no longer exists" still means "it
expired" to a waiter (see mutex.py).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import time
from dataclasses import dataclass

from services.locks.etcd_client import Etcd
from services.locks.metrics import LEASE_GRANTS, LEASES_REUSED

_GRANTED_ON_PATH = LEASE_GRANTS.labels("request")
_GRANTED_AHEAD = LEASE_GRANTS.labels("ahead")

MAX_AGE_SECONDS = 0.5  # how old a lease may be when it is handed out
MAX_TTLS = 16  # distinct TTLs kept warm at once (the least recently used is dropped)
MAX_SPARES = 32  # leases kept per TTL (given back ones beyond that just expire)


@dataclass(frozen=True)
class Lease:
    """A granted lease: its id, TTL, and when its grant was sent (wall and monotonic)."""

    id: int
    granted_at: float
    granted_mono: float
    ttl: int = 0
    used: bool = False  # it had a contender key (given back after a release)


class LeasePool:
    """Hands out leases; keeps spares per busy TTL: granted ahead, or given back."""

    def __init__(self, etcd: Etcd, max_age: float = MAX_AGE_SECONDS) -> None:
        self.etcd = etcd
        self.max_age = max_age
        # Per TTL, oldest grant first; every lease on a shelf is owned by the pool alone.
        self._shelves: dict[int, list[Lease]] = {}
        self._last_take: dict[int, float] = {}
        self._given_back: set[int] = set()  # TTLs with a lease given back since the last take
        self._tasks: set[asyncio.Task[None]] = set()
        self._refilling: set[int] = set()
        # Observable for tests and tools.
        self.taken = 0
        self.spares_used = 0  # takes served from a shelf
        self.reused = 0  # of those, leases given back after a release
        self.granted = 0  # grants sent (on a request's path or ahead)

    def _age_limit(self, ttl: int) -> float:
        return min(self.max_age, ttl / 10)

    async def take(self, ttl: int) -> Lease:
        """A lease with `ttl` seconds: a fresh spare or given-back one, else granted now."""
        now = time.monotonic()
        self.taken += 1
        last = self._last_take.pop(ttl, None)
        self._last_take[ttl] = now  # most recently used last
        limit = self._age_limit(ttl)
        lease = self._pop_usable(ttl, now, limit)
        returning = ttl in self._given_back
        self._given_back.discard(ttl)
        if last is not None and now - last <= limit:
            # Busy: grant ahead unless a lease will still be young enough at the next take
            # (expected as far ahead as the last gap): one on the shelf, or this one, if
            # leases have been coming back between takes.
            at = now + (now - last)
            shelf = self._shelves.get(ttl, ())
            covered = any(at - s.granted_mono <= limit for s in shelf) or (
                lease is not None and returning and at - lease.granted_mono <= limit
            )
            if not covered:
                self._refill(ttl)
        if lease is not None:
            self.spares_used += 1
            if lease.used:
                self.reused += 1
                LEASES_REUSED.inc()
            return lease
        _GRANTED_ON_PATH.inc()
        return await self._grant(ttl)

    def give_back(self, lease: Lease) -> None:
        """Shelve a released lease for reuse (caller: its only key is gone, never renewed).

        Kept with its original grant time; one too old to be handed out is dropped (it
        expires by itself, keyless: never revoked, see the module docstring).
        """
        now = time.monotonic()
        ttl = lease.ttl
        if ttl not in self._last_take or now - lease.granted_mono > self._age_limit(ttl):
            return
        # A new object: no age-out task knows it.
        self._shelve(dataclasses.replace(lease, used=True))
        self._given_back.add(ttl)

    def _shelve(self, lease: Lease) -> None:
        """Put `lease` on its TTL's shelf in grant order; past MAX_SPARES the oldest go."""
        shelf = self._shelves.setdefault(lease.ttl, [])
        bisect.insort(shelf, lease, key=lambda s: s.granted_mono)
        while len(shelf) > MAX_SPARES:
            self._discard(shelf.pop(0))

    def _pop_usable(self, ttl: int, now: float, limit: float) -> Lease | None:
        """The oldest lease on the shelf still young enough; too old ones are discarded."""
        shelf = self._shelves.get(ttl)
        while shelf:
            lease = shelf.pop(0)
            if now - lease.granted_mono <= limit:
                return lease
            self._discard(lease)
        return None

    def _discard(self, lease: Lease) -> None:
        """Let go of a shelved lease: revoke it if it never had a key, else let it expire."""
        if not lease.used:
            self._revoke(lease.id)

    async def _grant(self, ttl: int) -> Lease:
        # Taken before sending: etcd starts the TTL when it applies the grant, later.
        granted_at, granted_mono = time.time(), time.monotonic()
        self.granted += 1
        lease_id = await self.etcd.grant_lease(ttl)
        return Lease(lease_id, granted_at, granted_mono, ttl)

    def _refill(self, ttl: int) -> None:
        if ttl in self._refilling:
            return
        while len(self._last_take) > MAX_TTLS:
            oldest = next(iter(self._last_take))
            del self._last_take[oldest]
            self._given_back.discard(oldest)
            for dropped in self._shelves.pop(oldest, ()):
                self._discard(dropped)
        self._refilling.add(ttl)
        self._spawn(self._make_spare(ttl))

    async def _make_spare(self, ttl: int) -> None:
        try:
            _GRANTED_AHEAD.inc()
            lease = await self._grant(ttl)
        except Exception:
            return  # etcd is away: the next acquire grants (and reports) on its own path
        finally:
            self._refilling.discard(ttl)
        if ttl not in self._last_take:
            await self._revoke_now(lease.id)  # its TTL was dropped meanwhile
            return
        self._shelve(lease)
        # Not taken in time: revoke it rather than leave a keyless lease for a whole TTL.
        await asyncio.sleep(self._age_limit(ttl))  # the spare's shelf life, not a sync point
        shelf = self._shelves.get(ttl, [])
        for i, s in enumerate(shelf):
            if s is lease:  # still unused (a taken one comes back, if at all, as a new object)
                del shelf[i]
                await self._revoke_now(lease.id)
                break

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
        """Stop granting ahead; revoke the unused spares (bounded: etcd may be away).

        Given-back leases are dropped, not revoked: they expire by themselves.
        """
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shelves, self._shelves = list(self._shelves.values()), {}
        unused = [s.id for shelf in shelves for s in shelf if not s.used]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await asyncio.gather(*(self._revoke_now(i) for i in unused))
