"""Locally cached bytes of synced items, evicted when an item is tombstoned or purged."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol


class ByteCache(Protocol):
    """Where upstream bytes are cached locally, by key."""

    def evict(self, key: str) -> bool:
        """Remove the bytes under `key`; True if something was removed. Idempotent."""
        ...


class LocalByteCache:
    """A folder of cached objects (`{root}/{key}`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, key: str) -> Path:
        """The file holding `key`; keys never escape the root."""
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError(f"cache key escapes the cache root: {key!r}")
        return path

    def store(self, key: str, data: bytes) -> None:
        """Write `data` under `key` (tests and the download path fill the cache)."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def evict(self, key: str) -> bool:
        """Delete the cached file; a missing file is fine (already evicted)."""
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()
            return True
        return False
