"""The delta poll of one linked drive, and the full re-enumeration when its cursor expires.

Pages are followed by `@odata.nextLink` until a `@odata.deltaLink`, which is stored as
the drive's cursor in the same transaction as every change the pages carried: a failed
poll leaves the old cursor, and replaying pages is harmless (applying an entry twice
gives the same row; a tombstone stays a tombstone).

Links are followed only on the provider's own origin (`graph.py` checks them): a foreign
next/delta link is a permanent error, counted, the link never fetched nor stored.
Every lookup is scoped by the drive's tenant: a poll never reads or writes another
tenant's rows, even for the same account and upstream ids.

A 410 on the cursor is not a deletion: the cursor expired. The poll enumerates the drive
from scratch, applies what it sees, and for items it knew but did not see queues an item
sync (the item GET decides: 410 tombstones, 404 retries); the 410 itself tombstones
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.errors import PermanentError, TransientError
from services.common.jobs.job import Handler, JobContext
from services.common.logging import get_logger
from services.upload.files.tree import lock_tree
from services.upload.sync import items, metrics
from services.upload.sync.decisions import DeltaAction, decide_delta, is_expired
from services.upload.sync.drive_errors import raise_for_drive
from services.upload.sync.engine import SyncEngine
from services.upload.sync.jobs import enqueue_item_sync
from services.upload.sync.materialize import create_file
from services.upload.sync.models import (
    EXPIRED,
    REMOVED,
    SYNCED,
    TOMBSTONED,
    linked_drives,
    synced_items,
    utcnow,
)
from services.upload.sync.provider import ForeignLink, UpstreamError, UpstreamItem
from services.upload.sync.sync_job import job_context, tombstone_item

log = get_logger(__name__)


@dataclass
class DeltaResult:
    """What one poll did (stored as the job's effect)."""

    pages: int = 0
    full_resync: bool = False
    inserted: int = 0
    updated: int = 0
    tombstoned: int = 0
    ignored: int = 0
    rechecks: int = 0
    seen: set[str] = field(default_factory=set)

    def effect(self) -> dict[str, object]:
        """A small JSON summary."""
        return {
            "pages": self.pages,
            "full_resync": self.full_resync,
            "inserted": self.inserted,
            "updated": self.updated,
            "tombstoned": self.tombstoned,
            "ignored": self.ignored,
            "rechecks": self.rechecks,
        }


class CursorExpired(Exception):
    """The provider answered 410 on a delta or next link."""


async def apply_entry(
    engine: SyncEngine, session: AsyncSession, drive: RowMapping, entry: UpstreamItem
) -> str:
    """Apply one delta entry; returns inserted, updated, tombstoned or ignored."""
    # The tenant's tree lock before the first row this poll writes (tree.lock_tree; a
    # no-op once held): an entry may create a file or hide one, and log the change.
    await lock_tree(session, drive["tenant_id"])
    row = await items.find_upstream(session, drive["tenant_id"], drive["account_id"], entry.id)
    now = utcnow()
    if entry.removed:
        if row is None:
            return "ignored"  # never known here: nothing to hide
        # The delta itself says the item is gone: no per-item GET needed.
        return "tombstoned" if await tombstone_item(engine, session, row, REMOVED) else "ignored"
    if row is None:
        # First seen here: the item becomes a file in the drive's folder (materialize.py).
        file_id = (
            None
            if is_expired(entry.expires_at, now)
            else await create_file(session, drive, entry.id, entry.name, entry.size)
        )
        item_id = await items.insert_item(
            session,
            tenant_id=drive["tenant_id"],
            account_id=drive["account_id"],
            upstream_drive_id=drive["upstream_drive_id"],
            upstream_item_id=entry.id,
            drive_id=drive["id"],
            file_id=file_id,
            status=SYNCED,
            item=entry,
            now=now,
        )
        if is_expired(entry.expires_at, now):
            fresh = await items.load_item(session, item_id)
            assert fresh is not None
            await tombstone_item(engine, session, fresh, EXPIRED)
            return "tombstoned"
        return "inserted"
    if row["status"] == TOMBSTONED:
        return "ignored"  # terminal: a replayed or late entry never resurrects it
    if is_expired(entry.expires_at, now):
        await tombstone_item(engine, session, row, EXPIRED)
        return "tombstoned"
    await items.mark_synced(session, row["id"], entry, now)
    return "updated"


async def _follow(
    engine: SyncEngine,
    session: AsyncSession,
    drive: RowMapping,
    cursor: str | None,
    result: DeltaResult,
) -> str:
    """Apply pages from `cursor` until a delta link; returns it. Raises CursorExpired."""
    link = cursor
    for _ in range(engine.settings.max_delta_pages):
        try:
            page = await engine.provider.delta_page(
                drive["tenant_id"], drive["upstream_drive_id"], link
            )
        except UpstreamError as exc:
            if decide_delta(exc.status) is DeltaAction.FULL_RESYNC and link is not None:
                raise CursorExpired(str(exc)) from exc
            raise
        result.pages += 1
        metrics.DELTA_PAGES.inc()
        for entry in page.items:
            result.seen.add(entry.id)
            outcome = await apply_entry(engine, session, drive, entry)
            setattr(result, outcome, getattr(result, outcome) + 1)
        if page.delta_link:
            return page.delta_link
        if not page.next_link:
            raise TransientError("delta page has neither nextLink nor deltaLink")
        link = page.next_link
    raise PermanentError(f"delta of drive {drive['id']} exceeded {result.pages} pages")


async def _recheck_unseen(
    session: AsyncSession, drive: RowMapping, seen: set[str], result: DeltaResult
) -> None:
    """After a full enumeration: queue an item GET for each live item it did not list."""
    stmt = select(synced_items).where(
        synced_items.c.drive_id == drive["id"], synced_items.c.status != TOMBSTONED
    )
    for row in (await session.execute(stmt)).mappings():
        if row["upstream_item_id"] not in seen:
            await enqueue_item_sync(
                session, row["id"], reason="full_resync_unseen", context=job_context(row)
            )
            result.rechecks += 1


async def poll_drive(
    engine: SyncEngine, session: AsyncSession, drive_id: str, *, full: bool = False
) -> DeltaResult:
    """Poll one drive's delta in `session`'s transaction (see the module docstring).

    `full` (the provider dropped our subscription, so changes may have been missed):
    enumerate from scratch exactly as after an expired cursor.
    """
    result = DeltaResult()
    drive = await items.load_drive(session, drive_id)
    if drive is None:
        return result
    try:
        try:
            if full:
                raise CursorExpired("full re-enumeration requested")
            delta_link = await _follow(engine, session, drive, drive["delta_link"], result)
        except CursorExpired:
            metrics.FULL_RESYNCS.inc()
            log.warning("sync_delta_full_enumeration", drive_id=drive_id, requested=full)
            result.full_resync = True
            result.seen.clear()
            delta_link = await _follow(engine, session, drive, None, result)
            await _recheck_unseen(session, drive, result.seen, result)
    except UpstreamError as exc:
        raise_for_drive(exc, f"delta of drive {drive_id}")
    except ForeignLink as exc:
        metrics.FOREIGN_LINKS.inc()
        metrics.DEAD_LETTERS.labels("foreign_link").inc()
        log.warning("sync_delta_foreign_link", drive_id=drive_id, url=exc.url[:200])
        raise PermanentError(f"delta of drive {drive_id}: {exc}") from exc
    now = utcnow()
    values: dict[str, object] = {"delta_link": delta_link, "last_delta_at": now, "updated_at": now}
    if result.full_resync:
        values["last_full_resync_at"] = now
        values["full_resync_count"] = linked_drives.c.full_resync_count + 1
    await session.execute(
        update(linked_drives).where(linked_drives.c.id == drive_id).values(values)
    )
    log.info("sync_delta_polled", drive_id=drive_id, **result.effect())
    return result


def delta_handler(engine: SyncEngine) -> Handler:
    """The `upload.sync.delta` handler bound to `engine`."""

    async def handle(ctx: JobContext) -> None:
        result = await poll_drive(
            engine, ctx.session, ctx.payload["drive_id"], full=bool(ctx.payload.get("full"))
        )
        ctx.effect = result.effect()

    return handle
