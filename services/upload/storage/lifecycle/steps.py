"""The one shape every storage lifecycle step has: delete blobs, then mark the row, then
count and log.

Blobs go before the row that names them, so a crash in between leaves at worst a row
whose bytes are gone for something never read again (the step runs again and finds
nothing to delete). Each deletion counts its bytes in
serentak_upload_bytes_reclaimed_total{kind}.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.logging import get_logger
from services.upload import metrics
from services.upload.models import UploadRow
from services.upload.storage.blob_store import BlobStore

log = get_logger(__name__)


@dataclass
class ReclaimResult:
    """What one run deleted, in bytes per kind (and objects)."""

    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    objects: int = 0

    def add(self, kind: str, size: int, objects: int = 1) -> None:
        """Count one deletion."""
        self.bytes[kind] += size
        self.objects += objects
        metrics.BYTES_RECLAIMED.labels(kind).inc(size)


@dataclass(frozen=True)
class Doomed:
    """What a step deletes: the blob `key`, or every blob under `prefix`, counted as
    `size` bytes of `kind` (a prefix that turns out empty counts nothing)."""

    kind: str
    size: int
    key: str = ""
    prefix: str = ""


@dataclass(frozen=True)
class Mark:
    """The upload row columns set to `now` once its blobs are gone (only while the row is
    still in `status`, when given)."""

    sessions: async_sessionmaker[AsyncSession]
    upload_id: str
    columns: tuple[str, ...]
    now: datetime
    status: str | None = None


async def reclaim_step(
    blobs: BlobStore,
    result: ReclaimResult,
    doomed: Sequence[Doomed],
    event: str,
    mark: Mark | None = None,
    **fields: object,
) -> int:
    """Delete `doomed`, then apply `mark`, then count and log `event`; returns the objects
    removed (see the module docstring for the order)."""
    removed = size = 0
    for item in doomed:
        if item.prefix:
            objects = await blobs.delete_prefix(item.prefix)
        else:
            await blobs.delete(item.key)
            objects = 1
        if objects:
            result.add(item.kind, item.size, objects)
            removed += objects
            size += item.size
    if mark is not None:
        stmt = update(UploadRow).where(UploadRow.id == mark.upload_id)
        if mark.status is not None:
            stmt = stmt.where(UploadRow.status == mark.status)
        async with mark.sessions.begin() as session:
            await session.execute(stmt.values({c: mark.now for c in mark.columns}))
    log.info(event, objects=removed, bytes=size, **fields)
    return removed
