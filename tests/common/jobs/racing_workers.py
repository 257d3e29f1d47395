"""What the racing-worker tests share: workers run for a block, and a handler that
records the order jobs ran in, per partition, and any overlap."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from services.common.jobs import JobContext, Worker


@contextlib.asynccontextmanager
async def running(workers: Sequence[Worker]) -> AsyncIterator[None]:
    """Run `workers` for the block; on leaving it they are cancelled (a job in flight is
    handed back or left to its lease) and awaited."""
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class PartitionOrder:
    """`handler` appends each job's payload["i"] to its partition's list; two jobs of one
    partition running at once are recorded in `overlaps`."""

    def __init__(self) -> None:
        self.order: dict[str, list[int]] = {}
        self.overlaps: list[str] = []
        self._running: set[str] = set()

    async def handler(self, ctx: JobContext) -> None:
        """Record the job; yields once inside, so other jobs can interleave there."""
        key = ctx.job.partition_key
        if key in self._running:
            self.overlaps.append(key)
        self._running.add(key)
        await asyncio.sleep(0)
        self.order.setdefault(key, []).append(ctx.payload["i"])
        self._running.discard(key)

    def ran(self) -> int:
        """How many jobs ran so far."""
        return sum(map(len, self.order.values()))
