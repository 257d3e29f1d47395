"""Purge: drop cached bytes, then rows, of tombstones older than the retention.

Runs in batches; each batch's rows are taken with FOR UPDATE SKIP LOCKED on PostgreSQL
(SQLite has one writer at a time), and the delete is conditional on TOMBSTONED, so
several replicas purging at once neither block each other nor delete anything twice.
A row that names a local file is deleted only when the upload service supplied
`retire_files` (the upload app always does: `services/upload/files/retire.py` deletes the file
with its version bump and `file.deleted` event) and retired that file, in the same
transaction: the file and its tombstone go together, so the lifecycle ends with nothing
left to show. Without the hook (or for a file it keeps, e.g. a folder) the row stays,
bytes evicted, so the file stays hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.job import Handler, JobContext
from services.common.logging import get_logger
from services.upload.files.tree import lock_tree
from services.upload.sync import metrics
from services.upload.sync.engine import SyncEngine
from services.upload.sync.models import TOMBSTONED, synced_items, utcnow

log = get_logger(__name__)

MAX_BATCHES_PER_RUN = 20


@dataclass
class PurgeResult:
    """Counts of one purge run."""

    bytes_evicted: int = 0
    rows_deleted: int = 0
    rows_kept: int = 0


async def purge_batch(
    engine: SyncEngine, session: AsyncSession, cutoff: datetime, limit: int
) -> PurgeResult:
    """Purge up to `limit` tombstones older than `cutoff` in `session`'s transaction."""
    result = PurgeResult()
    stmt = (
        select(synced_items.c.id, synced_items.c.cache_key, synced_items.c.file_id)
        .where(
            synced_items.c.status == TOMBSTONED,
            synced_items.c.tombstoned_at < cutoff,
        )
        .order_by(synced_items.c.tombstoned_at)
        .limit(limit)
    )
    if engine.retire_files is None:
        # Rows kept for their file are re-visited only while they still hold bytes.
        stmt = stmt.where(synced_items.c.file_id.is_(None) | synced_items.c.cache_key.is_not(None))
    else:
        # Retiring files logs changes: the tenants' tree locks before any row lock
        # (tree.lock_tree), in one sorted order. The candidates are read without locks, and
        # only they are then locked, so no row of a tenant not locked here is touched.
        candidates = (
            await session.execute(
                stmt.with_only_columns(synced_items.c.id, synced_items.c.tenant_id)
            )
        ).all()
        for tenant in sorted({c.tenant_id for c in candidates}):
            await lock_tree(session, tenant)
        stmt = stmt.where(synced_items.c.id.in_([c.id for c in candidates]))
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    rows = (await session.execute(stmt)).all()
    if not rows:
        return result
    for row in rows:
        if row.cache_key and engine.cache.evict(row.cache_key):
            result.bytes_evicted += 1
    retired: set[str] = set()
    if engine.retire_files is not None:
        files = [r.file_id for r in rows if r.file_id is not None]
        if files:
            retired = set(await engine.retire_files(session, files))
    deletable = [r.id for r in rows if r.file_id is None or r.file_id in retired]
    kept = [r.id for r in rows if r.id not in set(deletable)]
    if kept:
        await session.execute(
            update(synced_items).where(synced_items.c.id.in_(kept)).values(cache_key=None)
        )
    if deletable:
        deleted = await session.execute(
            delete(synced_items).where(
                synced_items.c.id.in_(deletable), synced_items.c.status == TOMBSTONED
            )
        )
        result.rows_deleted = int(deleted.rowcount)  # type: ignore[attr-defined]
    result.rows_kept = len(kept)
    metrics.PURGED.labels("bytes").inc(result.bytes_evicted)
    metrics.PURGED.labels("rows").inc(result.rows_deleted)
    return result


async def purge(
    engine: SyncEngine, session: AsyncSession, *, now: datetime | None = None
) -> PurgeResult:
    """Purge in batches (at most MAX_BATCHES_PER_RUN; the next run takes the rest)."""
    settings = engine.settings
    cutoff = (now or utcnow()) - timedelta(seconds=settings.retention_seconds)
    total = PurgeResult()
    for _ in range(MAX_BATCHES_PER_RUN):
        batch = await purge_batch(engine, session, cutoff, settings.purge_batch_size)
        total.bytes_evicted += batch.bytes_evicted
        total.rows_deleted += batch.rows_deleted
        total.rows_kept += batch.rows_kept
        if batch.rows_deleted + batch.rows_kept < settings.purge_batch_size:
            break
        if not batch.rows_deleted and not batch.bytes_evicted:
            break  # a full batch of rows kept as they were: the next run sees the same
    log.info("sync_purge_finished", **vars(total))
    return total


def purge_handler(engine: SyncEngine) -> Handler:
    """The `upload.sync.purge` handler bound to `engine`."""

    async def handle(ctx: JobContext) -> None:
        ctx.effect = vars(await purge(engine, ctx.session))

    return handle
