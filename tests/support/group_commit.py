"""Forming one group commit in a test: units queued while a blocker holds the flusher."""

from __future__ import annotations

import asyncio

from services.common.group_commit import GroupCommits


async def gathered(groups: GroupCommits, works, orders=None, reads=None) -> list:
    """Run `works` (each with its lock order in `orders` and its declared reads in
    `reads`, if given) as one group: queued while a blocker holds the flusher. Their
    answers or errors, in order."""
    started, release = asyncio.Event(), asyncio.Event()

    async def blocker(session):
        started.set()
        await release.wait()

    first = asyncio.create_task(groups.run(blocker))
    await started.wait()  # the flusher is inside the blocker's group
    orders = orders or [()] * len(works)
    reads = reads or [None] * len(works)
    tasks = [
        asyncio.create_task(groups.run(w, o, reads=r))
        for w, o, r in zip(works, orders, reads, strict=True)
    ]
    await asyncio.sleep(0)  # one turn of the loop: each task queues its unit
    release.set()
    await first
    return await asyncio.gather(*tasks, return_exceptions=True)
