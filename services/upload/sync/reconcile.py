"""The periodic reconciliation poll: providers drop notifications, so poll anyway.

Each run tombstones items whose `expires_at` has passed (no network call), queues a
delta poll for every linked drive (collapsing with webhook-triggered ones) and an item
sync for each SYNCED item that belongs to no drive.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.job import Handler, JobContext
from services.upload.files.tree import lock_tree
from services.upload.sync.engine import SyncEngine
from services.upload.sync.jobs import enqueue_delta_poll, enqueue_item_sync
from services.upload.sync.models import (
    EXPIRED,
    SYNCED,
    TOMBSTONED,
    linked_drives,
    synced_items,
    utcnow,
)
from services.upload.sync.sync_job import job_context, tombstone_item

EXPIRY_BATCH = 1000


async def tombstone_expired(engine: SyncEngine, session: AsyncSession, limit: int) -> int:
    """Tombstone up to `limit` live items past their `expires_at`; returns how many."""
    now = utcnow()
    # Served by ix (status, expires_at): the live statuses are few and explicit.
    stmt = (
        select(synced_items)
        .where(synced_items.c.status != TOMBSTONED, synced_items.c.expires_at <= now)
        .order_by(synced_items.c.expires_at)
        .limit(limit)
    )
    rows = (await session.execute(stmt)).mappings().all()
    # Every tenant's tree lock before the first row is written, in one (sorted) order
    # (tree.lock_tree): each tombstone hides a file and logs the change.
    for tenant in sorted({row["tenant_id"] for row in rows}):
        await lock_tree(session, tenant)
    count = 0
    for row in rows:
        count += await tombstone_item(engine, session, row, EXPIRED)
    return count


async def reconcile(engine: SyncEngine, session: AsyncSession) -> dict[str, int]:
    """One reconciliation pass in `session`'s transaction; returns counts."""
    expired = await tombstone_expired(engine, session, EXPIRY_BATCH)
    drives = (await session.execute(select(linked_drives.c.id))).scalars().all()
    for drive_id in drives:
        await enqueue_delta_poll(
            session,
            drive_id,
            reason="reconcile",
            dedupe_window_seconds=engine.settings.webhook_dedupe_seconds,
        )
    standalone = (
        (
            await session.execute(
                select(synced_items).where(
                    synced_items.c.drive_id.is_(None), synced_items.c.status == SYNCED
                )
            )
        )
        .mappings()
        .all()
    )
    for row in standalone:
        await enqueue_item_sync(session, row["id"], reason="reconcile", context=job_context(row))
    return {"expired": expired, "drives": len(drives), "items": len(standalone)}


def reconcile_handler(engine: SyncEngine) -> Handler:
    """The `upload.sync.reconcile` handler bound to `engine`."""

    async def handle(ctx: JobContext) -> None:
        ctx.effect = await reconcile(engine, ctx.session)

    return handle
