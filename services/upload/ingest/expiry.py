"""Expiry and chunk cleanup: the `upload.expire` periodic job.

Each run, in short transactions of its own (the job's transaction stays unused, so on
SQLite the write lock is held only batch by batch):

1. Expire: uploads idle past the TTL move `uploading -> expired` with one conditional
   UPDATE ... WHERE status = 'uploading' AND updated_at < :cutoff (invariant 5: only
   from uploading; a chunk stored meanwhile bumps updated_at and keeps its upload alive).
2. Clean up: chunk blobs, then chunk rows, of `expired` and `aborted` uploads not yet
   cleaned, a batch of uploads per transaction. Those statuses are final, so a merging
   upload can never be picked; the row delete names the statuses again all the same.
   Blobs go first: a crash between the two leaves rows whose bytes are gone for an upload
   that will never merge, and the next run finishes the job (`chunks_purged_at` is set
   only with the row delete).
3. Dead merges: uploads left `merging` behind a dead-lettered merge job move to `failed`
   (`merge/stuck_merges.py`; handed in by the assembly, since ingest sits below merge).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.jobs import Handler, JobContext, PeriodicSchedule
from services.common.logging import get_logger
from services.upload import metrics
from services.upload.models import ABORTED, EXPIRED, UPLOADING, ChunkRow, UploadRow, utcnow
from services.upload.storage.blob_store import BlobStore, upload_prefix

log = get_logger(__name__)

EXPIRE_JOB = "upload.expire"
CLEANABLE = (EXPIRED, ABORTED)
BATCH_UPLOADS = 100
MAX_BATCHES_PER_RUN = 20


@dataclass
class CleanupResult:
    """What one run did."""

    expired: int = 0
    uploads_cleaned: int = 0
    chunk_rows_deleted: int = 0
    chunk_files_deleted: int = 0
    dead_merges_failed: int = 0


def expiry_schedule(interval_seconds: float) -> PeriodicSchedule:
    """The periodic schedule of the expiry + cleanup job."""
    return PeriodicSchedule(EXPIRE_JOB, interval_seconds)


async def expire_idle(
    sessions: async_sessionmaker[AsyncSession], ttl_seconds: float, now: datetime | None = None
) -> int:
    """Move every `uploading` upload idle longer than `ttl_seconds` to `expired`."""
    at = now or utcnow()
    cutoff = at - timedelta(seconds=ttl_seconds)
    async with sessions.begin() as session:
        result = await session.execute(
            update(UploadRow)
            .where(UploadRow.status == UPLOADING, UploadRow.updated_at < cutoff)
            .values(status=EXPIRED, updated_at=at)
        )
    expired = int(result.rowcount)  # type: ignore[attr-defined]
    metrics.EXPIRED_UPLOADS.inc(expired)
    return expired


async def clean_batch(
    sessions: async_sessionmaker[AsyncSession], blobs: BlobStore, limit: int
) -> CleanupResult:
    """Delete the chunks of up to `limit` expired/aborted uploads not cleaned yet."""
    result = CleanupResult()
    async with sessions() as session:
        ids = list(
            (
                await session.execute(
                    select(UploadRow.id)
                    .where(UploadRow.status.in_(CLEANABLE), UploadRow.chunks_purged_at.is_(None))
                    .order_by(UploadRow.updated_at)
                    .limit(limit)
                )
            ).scalars()
        )
    if not ids:
        return result
    for upload_id in ids:
        result.chunk_files_deleted += await blobs.delete_prefix(upload_prefix(upload_id))
    async with sessions.begin() as session:
        # Re-select under the write: only uploads still in a final, cleanable status.
        still = select(UploadRow.id).where(UploadRow.id.in_(ids), UploadRow.status.in_(CLEANABLE))
        deleted = await session.execute(delete(ChunkRow).where(ChunkRow.upload_id.in_(still)))
        marked = await session.execute(
            update(UploadRow)
            .where(UploadRow.id.in_(ids), UploadRow.status.in_(CLEANABLE))
            .values(chunks_purged_at=utcnow())
        )
    result.chunk_rows_deleted = int(deleted.rowcount)  # type: ignore[attr-defined]
    result.uploads_cleaned = int(marked.rowcount)  # type: ignore[attr-defined]
    metrics.PURGED_CHUNKS.inc(result.chunk_files_deleted)
    return result


async def expire_and_clean(
    sessions: async_sessionmaker[AsyncSession],
    blobs: BlobStore,
    ttl_seconds: float,
    *,
    batch: int = BATCH_UPLOADS,
    now: datetime | None = None,
    on_expired: Callable[[], None] = lambda: None,
) -> CleanupResult:
    """One run: expire idle uploads, then clean up to MAX_BATCHES_PER_RUN batches.
    `on_expired`: called once the expiry committed, if it expired any."""
    total = CleanupResult(expired=await expire_idle(sessions, ttl_seconds, now))
    if total.expired:
        on_expired()
    for _ in range(MAX_BATCHES_PER_RUN):
        step = await clean_batch(sessions, blobs, batch)
        total.uploads_cleaned += step.uploads_cleaned
        total.chunk_rows_deleted += step.chunk_rows_deleted
        total.chunk_files_deleted += step.chunk_files_deleted
        if step.uploads_cleaned < batch:
            break
    log.info("upload_cleanup_finished", **vars(total))
    return total


DeadMergeSweep = Callable[[async_sessionmaker[AsyncSession]], Awaitable[int]]


def expiry_handler(
    blobs: BlobStore,
    ttl_seconds: float,
    dead_merges: DeadMergeSweep,
    on_expired: Callable[[], None] = lambda: None,
) -> Handler:
    """The `upload.expire` handler: `expire_and_clean`, then the dead-merge sweep
    (`dead_merges`, which returns how many it failed), each in short transactions of its own.
    `on_expired` is called after a run's expiry committed some (it wakes every GetUpload
    waiting on this replica to re-read: the bulk update names no ids)."""

    async def handle(ctx: JobContext) -> None:
        sessions = ctx.sessions
        if sessions is None:
            raise RuntimeError("the job runtime gives handlers a session factory")
        result = await expire_and_clean(sessions, blobs, ttl_seconds, on_expired=on_expired)
        result.dead_merges_failed = await dead_merges(sessions)
        ctx.effect = vars(result)

    return handle
