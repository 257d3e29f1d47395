"""Rate limits that hold across replicas: fixed windows counted in a shared store, spent
through small local reservations.

Per key (one caller's family, e.g. upload's writes of user alice of tenant acme) and
window index `w = floor(now / window_seconds)`:

1. A replica spends units it already reserved for (key, w) without asking anyone.
2. With none left, the call waits in the key's line, and one task per key asks the store
   (one request at a time) to add up to `batch` units to the key's count for w, never past
   the limit (`CounterStore.take`: one UPSERT on PostgreSQL, one compare-and-swap on etcd,
   a dict in memory); the store answers how many it added, and those are this replica's
   to spend during w: the task hands one to each waiting call in turn, oldest first, and
   asks again while calls still wait. `batch` is limit/50, at least 1, at most batch_max.
   Each waiting call is woken once, with its answer: a burst of N calls on one key (a
   share told to 10,000 streams of one tenant is 10,000 stream messages on the tenant's
   key) costs N wake-ups, not N per request (when every request woke every waiter, that
   was quadratic and stalled a notify replica's loop for tens of seconds, issue 37).
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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
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


class _Again:
    """A waiting call's answer when its window ended before the store answered."""


_AGAIN = _Again()
# What a waiting call is told: admitted (None), refused (seconds to wait), or take again.
Answer = float | None | _Again


@dataclass
class _Reservation:
    window: int
    left: int = 0
    full: bool = False
    # Calls waiting for units from the store, oldest first (a cancelled one is skipped).
    waiting: deque[asyncio.Future[Answer]] = field(default_factory=deque)
    # The task asking the store for them while any waits; None when none does.
    refill: asyncio.Task[None] | None = None


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
        self._refills: set[asyncio.Task[None]] = set()

    def batch(self, limit: int, waiting: int = 1) -> int:
        """Units reserved from the store at once for a key of `limit` per window while
        `waiting` calls are in its line: a batch (limit/50, at most batch_max), or one for
        each waiting call, up to limit/50. Those are spent at once, so none lapse: a burst
        on one key (10,000 stream messages on a tenant's) is a few requests, not one per
        batch_max."""
        share = limit // BATCH_FRACTION
        return max(1, min(self._batch_max, share), min(waiting, share))

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
            # In the key's line: one task asks the store for everyone, one request at a
            # time, instead of each call reserving a batch it would spend one unit of. A
            # call cancelled while it waits (its client gone) just leaves the line.
            answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
            reservation.waiting.append(answer)
            if reservation.refill is None:
                reservation.refill = asyncio.create_task(
                    self._refill(key, reservation, limit), name=f"rate-refill {key}"
                )
                self._refills.add(reservation.refill)
                reservation.refill.add_done_callback(self._refills.discard)
            result = await answer
            if not isinstance(result, _Again):
                return result

    async def _refill(self, key: str, reservation: _Reservation, limit: int) -> None:
        """Answer `reservation`'s waiting calls: a unit each from the store, a batch per
        request, until none waits (a failed request lets the first through); all at once
        when the window is full or has ended."""
        waiting = reservation.waiting
        try:
            while waiting:
                window_end = (reservation.window + 1) * self.window_seconds
                if self._clock() >= window_end:
                    _answer_all(waiting, _AGAIN)  # they take again, in the new window
                    return
                try:
                    granted = await self.store.take(
                        key,
                        reservation.window,
                        self.batch(limit, len(waiting)),
                        limit,
                        int(window_end + self.window_seconds) + 1,
                    )
                except Exception as exc:  # fail open: see the module docstring
                    # For one call (the first in line): the next asks the store again.
                    RATE_LIMIT_STORE_ERRORS.labels(self._service).inc()
                    log.warning("rate_limit_store_failed", key=key, error=repr(exc))
                    _admit_first(waiting)
                    continue
                if granted <= 0:
                    reservation.full = True
                    wait = window_end - self._clock()
                    _answer_all(waiting, wait if wait > 0 else _AGAIN)
                    return
                # Granted for its window: if that ended meanwhile, the units lapse with it.
                reservation.left += granted
                _hand_out(reservation)
        finally:
            reservation.refill = None
            for answer in waiting:  # left only when this task itself was cancelled
                answer.cancel()
            waiting.clear()

    async def close(self) -> None:
        """Close the store."""
        await self.store.close()

    def give_back(self, key: str) -> None:
        """Return one unit taken from `key` in the current window (the call was refused by
        another of its limits), for this replica's next call of `key`."""
        reservation = self._reservations.get(key)
        if reservation is not None and reservation.window == self._window:
            reservation.left += 1
            _hand_out(reservation)  # to the next call in line, if one waits

    def _start_window(self, window: int) -> None:
        # Reservations of ended windows are worth nothing: drop them all at once.
        self._window = window
        self._reservations = {}


def _hand_out(reservation: _Reservation) -> None:
    """Admit the calls waiting in `reservation`'s line, oldest first, while units are left."""
    waiting = reservation.waiting
    while waiting and reservation.left > 0:
        answer = waiting.popleft()
        if not answer.done():  # a cancelled call left the line
            reservation.left -= 1
            answer.set_result(None)


def _admit_first(waiting: deque[asyncio.Future[Answer]]) -> None:
    """Admit the oldest call still waiting, uncounted (the store failed: fail open)."""
    while waiting:
        answer = waiting.popleft()
        if not answer.done():
            answer.set_result(None)
            return


def _answer_all(waiting: deque[asyncio.Future[Answer]], result: Answer) -> None:
    """Give every call still waiting `result`, and empty the line."""
    for answer in waiting:
        if not answer.done():
            answer.set_result(result)
    waiting.clear()
