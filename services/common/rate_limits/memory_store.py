"""Counts in this process: exact for a service with one replica by nature (SQLite)."""

from __future__ import annotations


class MemoryCounterStore:
    """`CounterStore` in a dict; counts of ended windows are dropped as windows pass."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._newest = -1

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        """Add up to `wanted` units to (key, window), never past `limit`; how many."""
        if window > self._newest:
            # Only the current window is ever asked for: forget every older one.
            self._newest = window
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= window}
        count = self._counts.get((key, window), 0)
        granted = max(0, min(wanted, limit - count))
        if granted:
            self._counts[(key, window)] = count + granted
        return granted

    async def close(self) -> None:
        """Nothing to let go of."""
