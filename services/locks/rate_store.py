"""Rate limit counts in etcd, the one store every lock service replica shares.

etcd has no increment, so `take` is a compare-and-swap on one key per (key, window):
write `count + granted` if the key's mod revision is still the one last seen, else read
it as it is now (in the same transaction) and try again. The count last seen by this
replica is the first guess, so an uncontended reservation is one round trip. Keys live
under `{lock_prefix}_rate/` (no tenant id starts with `_`, so no lock folder is there)
on one lease per window, granted once per window and replica, that outlives the window
by one more: etcd forgets old counts by itself.
"""

from __future__ import annotations

import asyncio
import math
from urllib.parse import quote

from services.locks.errors import EtcdUnavailable
from services.locks.etcd_client import Etcd

RATE_FOLDER = b"_rate/"
# Compare-and-swap rounds before the call is let through (the limiter fails open): each
# lost round means another replica's reservation went in, so this is reached only under
# a storm of them.
MAX_ROUNDS = 16


class EtcdCounterStore:
    """`CounterStore` on etcd keys (see the module docstring)."""

    def __init__(self, etcd: Etcd, lock_prefix: str, window_seconds: float) -> None:
        self._etcd = etcd
        root = lock_prefix if lock_prefix.endswith("/") else lock_prefix + "/"
        self._folder = root.encode() + RATE_FOLDER
        self._ttl = max(2, math.ceil(2 * window_seconds) + 1)
        # The window's lease, granted by its first caller; the others await the same one.
        self._lease: tuple[int, asyncio.Future[int]] | None = None
        # Per etcd key: (count, mod revision) as this replica last saw or wrote them.
        self._seen: dict[bytes, tuple[int, int]] = {}
        self._seen_window = -1

    async def take(self, key: str, window: int, wanted: int, limit: int, expires_at: int) -> int:
        """Add up to `wanted` units to (key, window), never past `limit`; how many."""
        if window != self._seen_window:
            self._seen_window, self._seen = window, {}
        etcd_key = self._folder + f"{window}/{quote(key, safe='')}".encode()
        lease = await self._window_lease(window)
        count, revision = self._seen.get(etcd_key, (0, 0))
        for _ in range(MAX_ROUNDS):
            granted = min(wanted, limit - count)
            if granted <= 0:
                return 0  # counts only grow within a window: what was full stays full
            written, now = await self._etcd.put_if_modified_at(
                etcd_key, revision, str(count + granted).encode(), lease
            )
            if written:
                self._seen[etcd_key] = (count + granted, written)
                return granted
            count, revision = (int(now.value), now.mod_revision) if now else (0, 0)
            self._seen[etcd_key] = (count, revision)
        raise EtcdUnavailable(f"rate count {key!r}: {MAX_ROUNDS} compare-and-swap rounds lost")

    async def close(self) -> None:
        """Nothing of its own: the etcd client is the service's (closed by it)."""

    async def _window_lease(self, window: int) -> int:
        if self._lease is None or self._lease[0] != window:
            grant = asyncio.ensure_future(self._etcd.grant_lease(self._ttl))
            self._lease = (window, grant)
        lease = self._lease
        try:
            return await asyncio.shield(lease[1])
        except BaseException:
            if self._lease is lease and lease[1].done():
                self._lease = None  # a failed grant is tried again by the next call
            raise
