"""Helpers for lock tests: waiting for the waiter queue to reach a size."""

from __future__ import annotations

import asyncio
import time

from serentak.locks.v1 import locks_pb2


async def wait_for_waiters(stub, key: str, count: int, within: float = 10.0, metadata=()):  # type: ignore[no-untyped-def]
    """Poll Describe until `key` has `count` waiters (an observable condition, bounded);
    `metadata` for a stub whose channel sends no credential by itself."""
    deadline = time.monotonic() + within
    while True:
        state = await stub.Describe(locks_pb2.DescribeRequest(key=key), metadata=metadata)
        if len(state.waiters) == count:
            return state
        assert time.monotonic() < deadline, f"never saw {count} waiters: {state}"
        await asyncio.sleep(0.01)
