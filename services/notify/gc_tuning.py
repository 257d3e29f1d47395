"""The notify process's garbage collector: start-up objects frozen, so full collections
stay short.

Measured (tests/benchmarks/bench_notify.py, stage timestamps per delivery): the commit →
delivery p99 was one full (generation 2) collection per few seconds of traffic, 45-86 ms
with the event loop stopped, because it walks every object alive, ~130,000 of them made
at start-up (modules, SQLAlchemy, protobuf descriptors, gRPC) that never die. Every
delivery in flight waited for it. `gc.freeze()` moves them to the collector's permanent
generation: a full collection then walks only what the service allocated since (~3 ms
measured), and fires just as often.

Thousands of open streams are a large heap made *after* start-up, and a fan-out to them
allocates tens of thousands of short-lived objects (deliveries, responses, wake-ups).
With the default young threshold (700 allocations) those survive a few young
collections, are promoted, and full collections follow: at 10,000 streams, 18 full
collections of up to 683 ms in a minute, and a share to 10,000 users reached its last
stream 1.5-2 s after commit (tests/benchmarks/bench_audience.py). With a young threshold
of 50,000 (`SERENTAK_NOTIFY_GC_YOUNG_THRESHOLD`) they die by reference count before a
collection sees them: one full collection in the same run, last delivery 0.6-1.0 s.

One frozen heap per process: the first running app freezes it (after a full collection,
so no garbage is frozen with it; that one collection, 50-110 ms measured, is paid right
after start-up) and the last one to stop unfreezes it (tests start many
apps in one process; nothing they leave stays out of the collector's reach).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

from services.common.logging import get_logger

log = get_logger(__name__)
_holders = 0
_collected = False
# Older generations' thresholds while held: a middle one per 20 young collections, a full
# one per 10 of those (and only past CPython's own 25%-of-the-heap rule).
_MIDDLE, _OLD = 20, 10
_thresholds: tuple[int, int, int] | None = None


def hold(young_threshold: int = 0) -> None:
    """Freeze the heap (the first holder in this process; later ones refreeze what has
    been made since, start-up objects of their own); with `young_threshold`, collect the
    young generation once per that many allocations until the last holder releases."""
    global _holders, _collected, _thresholds
    if not _collected:
        # Once per process: later holders (tests) would pay a full collection of a large
        # test process per app start; what they freeze is unfrozen when the last stops.
        gc.collect()
        _collected = True
    gc.freeze()
    if young_threshold and _thresholds is None:
        _thresholds = gc.get_threshold()
        gc.set_threshold(young_threshold, _MIDDLE, _OLD)
    _holders += 1
    log.info("gc_frozen", objects=gc.get_freeze_count(), thresholds=gc.get_threshold())


def release() -> None:
    """Undo one `hold`; the last one gives the frozen objects back to the collector."""
    global _holders, _thresholds
    _holders -= 1
    if _holders == 0:
        gc.unfreeze()
        if _thresholds is not None:
            gc.set_threshold(*_thresholds)
            _thresholds = None


def frozen_heap(young_threshold: int) -> Callable[[], Awaitable[None]]:
    """A background task holding the frozen heap (and `young_threshold`) while the
    service runs (until cancelled)."""

    async def held() -> None:
        hold(young_threshold)
        try:
            await asyncio.Event().wait()  # until the service stops (cancellation)
        finally:
            release()

    return held
