"""Rate limits that hold across replicas: fixed windows counted in a shared store, spent
through small local reservations.

Per key (one caller's family, e.g. upload's writes of user alice of tenant acme) and
window index `w = floor(now / window_seconds)`:

1. A replica spends units it already reserved for (key, w) without asking anyone.
2. With none left, it asks the store (one request per key at a time; the key's other
   calls wait for its answer) to add up to `batch` units to the key's count for w,
   never past the limit (`CounterStore.take`: one UPSERT on PostgreSQL, one compare-and-
   swap on etcd, a dict in memory); the store answers how many it added, and those are
   this replica's to spend during w. `batch` is limit/50, at least 1, at most batch_max.
3. When the store adds none the window is full on every replica: this one remembers it
   and refuses the key locally until w ends (a count never goes down within its window),
   with the time left in w as the retry delay.

Kept: over all replicas at most `limit` units of a key are admitted per window, since the
store never counts past the limit and a unit is admitted only once the store counted it
(tests/common/rate_limits/test_two_replicas.py races two processes on one store). Given
up, on purpose: a replica's unspent reservation lapses with its window, so with R replicas
up to R x (batch - 1) units of a window can go unused (about 2% of the limit per replica);
and a fixed window lets up to 2 x limit through in one window's length straddling a
boundary. Windows follow each replica's clock (skew shifts them by that much).

A store that fails lets the call through, counted in serentak_rate_limit_store_errors_total
and logged: the limiter protects the service and must not be what takes it down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.common.logging import get_logger
from services.common.metrics import RATE_LIMIT_STORE_ERRORS

log = get_logger(__name__)

# A reservation is a fiftieth of the limit: what a replica can leave unused per window.
BATCH_FRACTION = 50


class CounterStore(Protocol):
    """Where the counts of every replica meet."""

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        """Add up to `wanted` units to `key`'s count in window `window`, never past `limit`;
        return how many were added (0: the window is full). `expires_at` (epoch seconds):
        when the count may be forgotten."""
        ...

    async def close(self) -> None:
        """Let go of what the store holds (connections)."""
        ...


@dataclass
class _Reservation:
    window: int
    left: int = 0
    full: bool = False
    # Set while a store request for this key is in flight; done when it has answered.
    refill: asyncio.Future[None] | None = None


class Limiter:
    """One replica's view of the shared counts (see the module docstring)."""

    def __init__(
        self,
        store: CounterStore,
        *,
        service: str,
        window_seconds: float,
        batch_max: int = 32,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.window_seconds = window_seconds
        self._service = service
        self._batch_max = max(1, batch_max)
        self._clock = clock
        self._window = -1
        self._reservations: dict[str, _Reservation] = {}

    def batch(self, limit: int) -> int:
        """Units reserved from the store at once for a key of `limit` per window."""
        return max(1, min(self._batch_max, limit // BATCH_FRACTION))

    async def take(self, key: str, limit: int) -> float | None:
        """Admit one unit of `key` (at most `limit` per window over all replicas): None, or
        the seconds until its window ends and it has room again."""
        while True:
            now = self._clock()
            window = int(now // self.window_seconds)
            if window != self._window:
                self._start_window(window)
            reservation = self._reservations.get(key)
            if reservation is None:
                reservation = self._reservations[key] = _Reservation(window)
            if reservation.left > 0:
                reservation.left -= 1
                return None
            window_end = (window + 1) * self.window_seconds
            if reservation.full:
                return window_end - now
            if reservation.refill is not None:
                # One store request per key at a time: a burst waits for its reservation
                # instead of each call reserving a batch it would spend one unit of. Shielded:
                # a waiter cancelled (its client gone) must not cancel the refill the others
                # and the refilling call wait on.
                await asyncio.shield(reservation.refill)
                continue
            return await self._refill(key, reservation, limit, now, window_end)

    async def _refill(
        self, key: str, reservation: _Reservation, limit: int, now: float, window_end: float
    ) -> float | None:
        refill = reservation.refill = asyncio.get_running_loop().create_future()
        try:
            granted = await self.store.take(
                key,
                reservation.window,
                self.batch(limit),
                limit,
                int(window_end + self.window_seconds) + 1,
            )
        except Exception as exc:  # fail open: see the module docstring
            RATE_LIMIT_STORE_ERRORS.labels(self._service).inc()
            log.warning("rate_limit_store_failed", key=key, error=repr(exc))
            return None
        finally:
            reservation.refill = None
            if not refill.done():
                refill.set_result(None)
        if granted <= 0:
            reservation.full = True
            return window_end - now
        # Granted for its window: if that ended meanwhile, the units lapse with it.
        reservation.left += granted - 1
        return None

    async def close(self) -> None:
        """Close the store."""
        await self.store.close()

    def give_back(self, key: str) -> None:
        """Return one unit taken from `key` in the current window (the call was refused by
        another of its limits), for this replica's next call of `key`."""
        reservation = self._reservations.get(key)
        if reservation is not None and reservation.window == self._window:
            reservation.left += 1

    def _start_window(self, window: int) -> None:
        # Reservations of ended windows are worth nothing: drop them all at once.
        self._window = window
        self._reservations = {}
