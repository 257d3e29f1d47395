"""Folder listings cached under versioned keys: `folder:{id}:children:v{version}`.

The version is the folder's `children_version`, bumped in the same transaction as any
change to a child. A reader first reads the current version from the database, so it can
only hit an entry made for that version: a listing older than a committed rename is never
served (invariant 11). Entries of older versions are dropped after the commit that
outdated them (never before: a concurrent reader could otherwise re-fill it stale).

An entry holds only what every caller sees alike (rows without roles, `listing.Page`):
each caller's roles are applied per request, so one caller's role never reaches another.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from services.upload import metrics


def listing_key(folder_id: str, version: int, page: str) -> str:
    """The cache key of one page of a folder listing at `version`."""
    return f"folder:{folder_id}:children:v{version}:{page}"


class ListingCache:
    """A bounded in-memory LRU of folder listing pages."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._entries: OrderedDict[str, Any] = OrderedDict()

    def get(self, key: str) -> Any | None:
        """The cached value or None."""
        value = self._entries.get(key)
        if value is None:
            metrics.CACHE_MISSES.inc()
            return None
        self._entries.move_to_end(key)
        metrics.CACHE_HITS.inc()
        return value

    def put(self, key: str, value: Any) -> None:
        """Remember `value` under `key`, evicting the least recently used entry."""
        if self._max <= 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def invalidate_folder(self, folder_id: str | None) -> None:
        """Drop every entry of `folder_id` (call after the commit that changed it)."""
        if not folder_id:
            return
        prefix = f"folder:{folder_id}:children:"
        for key in [k for k in self._entries if k.startswith(prefix)]:
            del self._entries[key]
            metrics.CACHE_INVALIDATIONS.inc()
