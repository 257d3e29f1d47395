"""A handler that records the order jobs ran in, per partition, and any overlap."""

from __future__ import annotations

import asyncio

from services.common.jobs import JobContext


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
