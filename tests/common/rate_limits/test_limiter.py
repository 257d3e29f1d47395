"""The limiter's algorithm on the in-memory store, with a clock the test moves: the limit
per window, reservations, the local 'full' answer, give-back, a failing store."""

from __future__ import annotations

import asyncio

import pytest

from services.common.metrics import RATE_LIMIT_STORE_ERRORS
from services.common.rate_limits import Limiter, MemoryCounterStore

WINDOW = 10.0


class Clock:
    """A clock the test sets (epoch seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingStore(MemoryCounterStore):
    """The memory store, counting how often it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        self.calls += 1
        return await super().take(key, window, wanted, limit, expires_at)


class SlowStore(CountingStore):
    """The memory store answering on a later loop turn, as a real store does."""

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        await asyncio.sleep(0)
        return await super().take(key, window, wanted, limit, expires_at)


class BrokenStore:
    """A store whose every answer is an error (a database that is down)."""

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        raise ConnectionError("store down")

    async def close(self) -> None:
        pass


def limiter(store, clock: Clock, batch_max: int = 32) -> Limiter:
    return Limiter(store, service="test", window_seconds=WINDOW, batch_max=batch_max, clock=clock)


async def admitted(lim: Limiter, key: str, limit: int, calls: int) -> int:
    return sum([await lim.take(key, limit) is None for _ in range(calls)])


async def test_a_window_admits_exactly_its_limit_then_says_when_it_ends() -> None:
    clock = Clock(1000.5)  # 0.5 s into window 100
    lim = limiter(MemoryCounterStore(), clock)
    assert await admitted(lim, "k", 7, 20) == 7
    assert await lim.take("k", 7) == pytest.approx(WINDOW - 0.5)
    clock.now = 1009.0
    assert await lim.take("k", 7) == pytest.approx(1.0)
    assert await admitted(lim, "other", 7, 7) == 7  # keys are apart
    clock.now = 1010.0  # the next window
    assert await admitted(lim, "k", 7, 20) == 7


async def test_replicas_together_never_pass_the_limit_and_reserve_in_batches() -> None:
    # Answering on a later loop turn, as over a network: the replicas' requests interleave.
    store, clock = SlowStore(), Clock(0.0)
    # Two replicas on one store; limit 500: batches of 500/50 = 10.
    a, b = limiter(store, clock), limiter(store, clock)
    assert a.batch(500) == 10 and a.batch(20) == 1 and a.batch(10**6) == 32
    results = await asyncio.gather(*(lim.take("k", 500) for _ in range(400) for lim in (a, b)))
    assert sum(r is None for r in results) == 500
    # Each store call reserved up to 10 units; refusals after it are answered locally.
    assert store.calls <= 500 // 10 + 2 * 2, store.calls
    calls = store.calls
    assert await a.take("k", 500) is not None and await b.take("k", 500) is not None
    assert store.calls == calls


async def test_an_unspent_reservation_is_what_a_replica_can_leave_unused() -> None:
    store, clock = MemoryCounterStore(), Clock(0.0)
    a, b = limiter(store, clock), limiter(store, clock)
    assert await a.take("k", 100) is None  # a reserves 2 (100 / 50), spends 1
    assert await admitted(b, "k", 100, 200) == 98
    assert await a.take("k", 100) is None  # a's reserved unit
    assert await a.take("k", 100) is not None


async def test_a_unit_given_back_is_spent_by_the_next_call() -> None:
    store, clock = CountingStore(), Clock(0.0)
    lim = limiter(store, clock)
    assert await admitted(lim, "k", 3, 3) == 3
    lim.give_back("k")
    assert await lim.take("k", 3) is None
    assert await lim.take("k", 3) is not None


async def test_a_failing_store_lets_calls_through_and_is_counted() -> None:
    errors = RATE_LIMIT_STORE_ERRORS.labels("test")
    before = errors._value.get()
    lim = limiter(BrokenStore(), Clock(0.0))
    assert await admitted(lim, "k", 1, 5) == 5
    assert errors._value.get() == before + 5
    # Calls waiting in one key's line too: each let through is one failed request.
    assert await asyncio.gather(*(lim.take("k", 1) for _ in range(5))) == [None] * 5
    assert errors._value.get() == before + 10


class GatedStore(MemoryCounterStore):
    """The memory store, answering only once the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        self.asked.set()
        await self.gate.wait()
        return await super().take(key, window, wanted, limit, expires_at)


async def test_a_waiter_cancelled_during_a_refill_leaves_the_others_their_answer() -> None:
    """Calls of one key wait for the one refill under way; one of them cancelled (its
    client gone) must not cancel that refill for the rest. (It did: the refilling call
    then failed with InvalidStateError, an INTERNAL to an innocent stream, and every
    other waiter was cancelled.)"""
    store = GatedStore()
    lim = limiter(store, Clock(1000.5))
    refilling = asyncio.create_task(lim.take("k", 100))
    await store.asked.wait()
    waiters = [asyncio.create_task(lim.take("k", 100)) for _ in range(3)]
    await asyncio.sleep(0)  # one loop turn: each waiter runs up to the refill it waits on
    waiters[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiters[0]
    store.gate.set()
    assert await refilling is None
    assert [await w for w in waiters[1:]] == [None, None]


class CountingClock(Clock):
    """A clock the test sets, counting how often it is read."""

    def __init__(self, now: float) -> None:
        super().__init__(now)
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


async def test_a_burst_on_one_key_wakes_each_waiting_call_once() -> None:
    """A burst on one key reserves a unit for each waiting call (up to limit/50) per store
    request, and each waiting call is woken once, with its answer: each call reads the
    clock once. (Every request used to wake every waiter to try again, and reserve 32
    units: 10,000 notify streams told of one share, all on their tenant's key, spent tens
    of seconds of the replica's loop waking them, then 313 round trips in a row.)"""
    store, clock = SlowStore(), CountingClock(0.0)
    lim = limiter(store, clock)  # batches of 32
    results = await asyncio.gather(*(lim.take("k", 10**6) for _ in range(2_000)))
    assert results == [None] * 2_000
    assert store.calls == 1
    assert clock.reads <= 2_000 + 2 * store.calls, clock.reads
    # Up to limit/50 at once: a burst past it takes a request per 2% of the limit.
    store = SlowStore()
    lim = limiter(store, CountingClock(0.0))
    results = await asyncio.gather(*(lim.take("k", 50_000) for _ in range(2_500)))
    assert results == [None] * 2_500
    assert store.calls == 3  # 1,000 + 1,000 + 500
