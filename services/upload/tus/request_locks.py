"""One request at a time per tus upload on this replica.

A client that lost its connection resumes with HEAD then PATCH while the server may still
be finishing the cut request (writing its tail): HEAD and PATCH wait for it, so the
offset they see is the one it left. A request still holding the upload after
`wait_seconds` (a live, slow one) makes the newcomer 423 Locked, as tusd answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from services.upload.tus.protocol import TusError


class RequestLocks:
    """Per-upload asyncio locks, dropped when nobody holds or waits for them."""

    def __init__(self, wait_seconds: float) -> None:
        self._wait = wait_seconds
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold `key`'s lock for the block; 423 after waiting `wait_seconds`."""
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            try:
                if lock.locked():
                    async with asyncio.timeout(self._wait):
                        await lock.acquire()
                else:
                    await lock.acquire()  # free: taken at once, without yielding to the loop
            except TimeoutError:
                raise TusError(
                    423, "UPLOAD_LOCKED", "another request is writing this upload"
                ) from None
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
