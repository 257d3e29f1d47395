"""Conflicts fought over one chunk index: the seed's "spike of conflicts on the same index".

A per-index label would grow without bound, so each replica remembers the conflicts of
the most recent (upload, index) pairs in a bounded LRU and counts every conflict on a pair
that already conflicted (`serentak_upload_chunk_index_conflict_repeats_total`). One client
re-sending different bytes for an index, or two writers sharing an upload, shows up here;
scattered one-off conflicts do not.
"""

from __future__ import annotations

from collections import OrderedDict

from services.upload import metrics

CAPACITY = 10_000


class ConflictRepeats:
    """Conflict counts of the latest `capacity` (upload_id, chunk_index) pairs."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._counts: OrderedDict[tuple[str, int], int] = OrderedDict()

    def record(self, upload_id: str, chunk_index: int) -> int:
        """Count one conflict; returns how many this pair has had (2+ counts as a repeat)."""
        key = (upload_id, chunk_index)
        count = self._counts.pop(key, 0) + 1
        self._counts[key] = count
        if len(self._counts) > self._capacity:
            self._counts.popitem(last=False)
        if count >= 2:
            metrics.CHUNK_INDEX_CONFLICT_REPEATS.inc()
        return count


# One per process: the upload servicer's chunk store records into it.
REPEATS = ConflictRepeats()
