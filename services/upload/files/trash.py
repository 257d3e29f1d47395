"""The periodic `upload.purge_trash` job: deleted items leave the trash after a retention.

An item deleted (DeleteFile) more than `trash_retention_days` ago is purged with everything
under it (a deleted folder's whole subtree: nothing can restore it any more), one item a
transaction, under the tenant's tree lock, so a restore racing the purge either lands
first (the item is no longer due and stays) or finds the item gone (NOT_FOUND):

- items under it that were not deleted themselves get their version bump and a
  `file.deleted` event (their collaborators learn they are gone, invariant 6); the item
  itself announced its deletion when it was deleted;
- every item that goes ends its aggregate with a `file.purged` outbox event at the version
  after its last (told to nobody), so subscribers apply it after every earlier event and
  may forget the item (notify retires its version row, `services/notify/retirement.py`);
- its shares and rows are deleted, deepest first (rows name their parent); the parent
  folder's listing version moves;
- one audit row, `file.purged`, names the item and what went with it.

The tenant's quota counts file rows (`ingest/allowance.py`, `quota_use`), so it is
released at commit. The bytes of every version of a purged file then belong to a completed
upload whose file row is gone: the next `upload.reclaim` deletes them (step 4, retired
files) and then the upload and chunk rows (`lifecycle/retired_rows.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import audit
from services.common.jobs import Handler, JobContext, PeriodicSchedule
from services.common.logging import get_logger
from services.upload import metrics
from services.upload.files.events import record_file_event, record_purged
from services.upload.files.permissions import MAX_DEPTH
from services.upload.files.tree import lock_tree
from services.upload.files.versions import bump, touch_folder
from services.upload.models import FILE, FileRow, ShareRow, utcnow

log = get_logger(__name__)

PURGE_TRASH_JOB = "upload.purge_trash"
BATCH = 100


@dataclass
class TrashPurged:
    """What one run removed: items (the trash's entries), rows and file bytes."""

    items: int = 0
    rows: int = 0
    file_bytes: int = 0


def purge_trash_schedule(interval_seconds: float) -> PeriodicSchedule:
    """The periodic schedule of the trash purge."""
    return PeriodicSchedule(PURGE_TRASH_JOB, interval_seconds)


async def _subtree(session: AsyncSession, top: FileRow) -> list[list[FileRow]]:
    """`top` and everything under it, level by level (top first)."""
    levels = [[top]]
    while levels[-1] and len(levels) <= MAX_DEPTH + 1:
        parents = [f.id for f in levels[-1]]
        children = await session.execute(
            select(FileRow)
            .where(FileRow.parent_id.in_(parents), FileRow.tenant_id == top.tenant_id)
            .order_by(FileRow.id)
        )
        levels.append(list(children.scalars()))
    return [level for level in levels if level]


async def purge_item(
    session: AsyncSession, file_id: str, cutoff: datetime, result: TrashPurged
) -> bool:
    """Purge one trashed item (module docstring) in `session`; False if no longer due."""
    top = await session.get(FileRow, file_id, populate_existing=True)
    if top is None:
        return False
    await lock_tree(session, top.tenant_id)
    top = await session.get(FileRow, file_id, populate_existing=True)
    # Re-read under the lock: a restore (or a later deletion) since the scan keeps it.
    if top is None or top.deleted_at is None or top.deleted_at >= cutoff:
        return False
    levels = await _subtree(session, top)
    files = sizes = 0
    for level in levels[1:]:
        for row in level:
            if row.deleted_at is None:
                row = await bump(session, row, 0)
                await record_file_event(
                    session,
                    "file.deleted",
                    row,
                    "",
                    idempotency_key=f"trash-purge:{row.id}",
                    file_id=row.id,
                    name=row.name,
                )
    for level in reversed(levels):
        ids = [row.id for row in level]
        # Versions as stored now: the live items above were bumped by their file.deleted.
        last = await session.execute(
            select(FileRow.id, FileRow.kind, FileRow.version)
            .where(FileRow.id.in_(ids))
            .order_by(FileRow.id)
        )
        await record_purged(session, top.tenant_id, [(i, kind, v) for i, kind, v in last])
        files += sum(1 for row in level if row.kind == FILE)
        sizes += sum(row.size for row in level if row.kind == FILE)
        await session.execute(delete(ShareRow).where(ShareRow.file_id.in_(ids)))
        await session.execute(delete(FileRow).where(FileRow.id.in_(ids)))
    await touch_folder(session, top.parent_id)
    rows = sum(len(level) for level in levels)
    await audit.record(
        session,
        tenant_id=top.tenant_id,
        principal=audit.SYSTEM,
        action="file.purged",
        target_type=top.kind,
        target_id=top.id,
        detail={"name": top.name, "items": rows, "files": files, "bytes": sizes},
    )
    result.items += 1
    result.rows += rows
    result.file_bytes += sizes
    metrics.TRASH_PURGED.labels(top.kind).inc()
    metrics.TRASH_PURGED_BYTES.inc(sizes)
    log.info("trash_item_purged", file_id=top.id, tenant_id=top.tenant_id, rows=rows, bytes=sizes)
    return True


async def purge_trash(
    sessions: async_sessionmaker[AsyncSession],
    retention: timedelta,
    now: datetime | None = None,
) -> TrashPurged:
    """Purge every item deleted before `now - retention`, oldest deletion first."""
    cutoff = (now or utcnow()) - retention
    result = TrashPurged()
    seen: set[str] = set()
    while True:
        async with sessions() as session:
            due = [
                i
                for i in (
                    await session.execute(
                        select(FileRow.id)
                        .where(FileRow.deleted_at.is_not(None), FileRow.deleted_at < cutoff)
                        .order_by(FileRow.deleted_at, FileRow.id)
                        .limit(BATCH)
                    )
                ).scalars()
                if i not in seen
            ]
        if not due:
            return result
        for file_id in due:
            seen.add(file_id)
            async with sessions.begin() as session:
                await purge_item(session, file_id, cutoff, result)


def purge_trash_handler(retention: timedelta) -> Handler:
    """The `upload.purge_trash` handler (one transaction per item, of its own)."""

    async def handle(ctx: JobContext) -> None:
        if ctx.sessions is None:
            raise RuntimeError("the job runtime gives handlers a session factory")
        result = await purge_trash(ctx.sessions, retention)
        ctx.effect = {"items": result.items, "rows": result.rows, "bytes": result.file_bytes}

    return handle
