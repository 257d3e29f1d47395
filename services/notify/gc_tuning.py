"""The notify process's garbage collector: start-up objects frozen, so full collections
stay short.

Measured (tests/benchmarks/bench_notify.py, stage timestamps per delivery): the commit →
delivery p99 was one full (generation 2) collection per few seconds of traffic, 45-86 ms
with the event loop stopped, because it walks every object alive, ~130,000 of them made
at start-up (modules, SQLAlchemy, protobuf descriptors, gRPC) that never die. Every
delivery in flight waited for it. `gc.freeze()` moves them to the collector's permanent
generation: a full collection then walks only what the service allocated since (~3 ms
measured), and fires just as often.

One frozen heap per process: the first running app freezes it (after a full collection,
so no garbage is frozen with it; that one collection, 50-110 ms measured, is paid right
after start-up) and the last one to stop unfreezes it (tests start many
apps in one process; nothing they leave stays out of the collector's reach).
"""

from __future__ import annotations

import asyncio
import gc

from services.common.logging import get_logger

log = get_logger(__name__)
_holders = 0
_collected = False


def hold() -> None:
    """Freeze the heap (the first holder in this process; later ones refreeze what has
    been made since, start-up objects of their own)."""
    global _holders, _collected
    if not _collected:
        # Once per process: later holders (tests) would pay a full collection of a large
        # test process per app start; what they freeze is unfrozen when the last stops.
        gc.collect()
        _collected = True
    gc.freeze()
    _holders += 1
    log.info("gc_frozen", objects=gc.get_freeze_count())


def release() -> None:
    """Undo one `hold`; the last one gives the frozen objects back to the collector."""
    global _holders
    _holders -= 1
    if _holders == 0:
        gc.unfreeze()


async def frozen_heap() -> None:
    """Background task: hold the frozen heap while the service runs (until cancelled)."""
    hold()
    try:
        await asyncio.Event().wait()  # until the service stops (cancellation)
    finally:
        release()
