"""The item sync job: one upstream GET, then the action `decisions.decide_item` names.

The upstream call holds no database transaction: the item is read in a short
transaction of its own (`ctx.sessions`), the GET runs, and only then does the job's own
transaction (`ctx.session`) begin, re-reading the item under a row lock and applying the
outcome to what it finds (on SQLite a begun transaction holds the database's write lock,
on PostgreSQL `FOR UPDATE` holds the row: neither may wait on the network).

Writes go through the job's own transaction, so the new status, the
follow-up job and the job's completion commit together. A 404 is therefore retried by
enqueueing a follow-up job with a jittered `run_after` (the PENDING_RETRY row and its
count must survive, which a raised error would roll back); 429/5xx raise typed job
errors and let the runtime's retry policy (Retry-After as a floor) schedule the retry.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.errors import PermanentError, RetryLater, TransientError
from services.common.jobs.job import Handler, JobContext
from services.common.logging import get_logger
from services.upload.files import change_log
from services.upload.files.permissions import audience
from services.upload.files.tree import lock_tree
from services.upload.models import FileRow
from services.upload.sync import items, metrics
from services.upload.sync.decisions import ItemAction, decide_item, is_expired, not_found_delay
from services.upload.sync.engine import SyncEngine
from services.upload.sync.jobs import enqueue_item_sync
from services.upload.sync.models import EXPIRED, GONE, REMOVED, TOMBSTONED, utcnow
from services.upload.sync.provider import UpstreamError, UpstreamItem

log = get_logger(__name__)


def job_context(row: RowMapping) -> dict[str, str]:
    """Ids an operator needs to read a dead letter without the database."""
    return {
        "tenant_id": row["tenant_id"],
        "account_id": row["account_id"],
        "upstream_drive_id": row["upstream_drive_id"],
        "upstream_item_id": row["upstream_item_id"],
        "file_id": row["file_id"] or "",
    }


async def tombstone_item(
    engine: SyncEngine, session: AsyncSession, row: RowMapping, reason: str
) -> bool:
    """Tombstone `row` in the session's transaction and evict its cached bytes."""
    # Hides a file and logs it: the tenant's tree lock first (tree.lock_tree; the callers
    # take it before their first row, so here it is held already).
    await lock_tree(session, row["tenant_id"])
    if not await items.tombstone(session, row["id"], reason, utcnow()):
        return False
    file = await session.get(FileRow, row["file_id"]) if row["file_id"] else None
    if file is not None:
        # Hidden from the tree from now on: ListChanges tells whoever could see it.
        await change_log.append(session, "file.hidden", file, await audience(session, file))
    metrics.TOMBSTONES.labels(reason).inc()
    if row["cache_key"]:
        # Evicted before commit: if the commit fails the cache is merely cold, and the
        # purge job evicts again (idempotent) for any tombstone that still names a key.
        engine.cache.evict(row["cache_key"])
    log.info(
        "sync_item_tombstoned",
        item_id=row["id"],
        upstream_item_id=row["upstream_item_id"],
        file_id=row["file_id"],
        reason=reason,
    )
    return True


async def sync_item(engine: SyncEngine, ctx: JobContext) -> str:
    """Run one item sync; returns the outcome name (also stored as the job's effect)."""
    item_id = ctx.payload["item_id"]
    if ctx.sessions is not None:
        async with ctx.sessions() as session:
            seen = await items.load_item(session, item_id)
    else:
        # An old runtime without a session factory: the job's transaction is all there is
        # (the row lock is taken below, after the tree lock).
        seen = await items.load_item(ctx.session, item_id)
    if seen is None:
        return "unlinked"
    if seen["status"] == TOMBSTONED:
        # Terminal: never spend an upstream call on the dead.
        metrics.TOMBSTONED_SKIPS.inc()
        return "already_tombstoned"
    upstream: UpstreamItem | None = None
    failure: UpstreamError | None = None
    if not is_expired(seen["expires_at"], utcnow()):
        try:
            upstream = await engine.provider.get_item(
                seen["tenant_id"], seen["upstream_drive_id"], seen["upstream_item_id"]
            )
        except UpstreamError as exc:
            failure = exc
    # The job's transaction begins here: re-read under the row lock, apply to what is there
    # now (unlinked or tombstoned meanwhile: the answer is dropped). The tenant's tree lock
    # first (tree.lock_tree): a tombstone hides the file and logs the change.
    await lock_tree(ctx.session, seen["tenant_id"])
    row = await items.load_item(ctx.session, item_id, for_update=True)
    if row is None:
        return "unlinked"
    if row["status"] == TOMBSTONED:
        metrics.TOMBSTONED_SKIPS.inc()
        return "already_tombstoned"
    if is_expired(row["expires_at"], utcnow()):
        await tombstone_item(engine, ctx.session, row, EXPIRED)
        return "tombstoned_expired"
    if failure is not None:
        return await _handle_error(engine, ctx, row, failure)
    if upstream is None:
        # Not expired now though it was when read (expiry moved): sync on the next trigger.
        raise RetryLater(f"item {row['id']} changed expiry during the sync; retrying")
    if upstream.removed:
        await tombstone_item(engine, ctx.session, row, REMOVED)
        return "tombstoned_removed"
    if is_expired(upstream.expires_at, utcnow()):
        await tombstone_item(engine, ctx.session, row, EXPIRED)
        return "tombstoned_expired"
    await items.mark_synced(ctx.session, row["id"], upstream, utcnow())
    return "synced"


async def _handle_error(
    engine: SyncEngine, ctx: JobContext, row: RowMapping, exc: UpstreamError
) -> str:
    settings = engine.settings
    decision = decide_item(
        exc.status,
        retry_count=row["retry_count"],
        max_not_found_retries=settings.max_not_found_retries,
        retry_after=exc.retry_after,
    )
    where = f"item {row['upstream_item_id']} on drive {row['upstream_drive_id']}"
    match decision.action:
        case ItemAction.TOMBSTONE:
            await tombstone_item(engine, ctx.session, row, GONE)
            return "tombstoned_gone"
        case ItemAction.RETRY_NOT_FOUND:
            delay = not_found_delay(
                decision.retry_count,
                base_seconds=settings.not_found_backoff_base_seconds,
                cap_seconds=settings.not_found_backoff_cap_seconds,
            )
            now = utcnow()
            next_at = now + timedelta(seconds=delay)
            await items.mark_pending_retry(
                ctx.session,
                row["id"],
                retry_count=decision.retry_count,
                status_code=404,
                error=str(exc),
                next_retry_at=next_at,
                now=now,
            )
            await enqueue_item_sync(
                ctx.session,
                row["id"],
                reason="not_found",
                run_after=next_at,
                context=job_context(row),
            )
            metrics.RETRIES.labels("not_found").inc()
            log.info(
                "sync_item_not_found_retry",
                item_id=row["id"],
                retry_count=decision.retry_count,
                delay_seconds=round(delay, 3),
            )
            return "pending_retry"
        case ItemAction.GIVE_UP_NOT_FOUND:
            metrics.DEAD_LETTERS.labels("not_found").inc()
            raise PermanentError(
                f"{where} answered 404 {decision.retry_count} times in a row "
                f"(bound {settings.max_not_found_retries} retries); last: {exc}"
            ) from exc
        case ItemAction.RETRY_AFTER:
            metrics.RETRIES.labels("retry_after").inc()
            raise RetryLater(f"{where} throttled: {exc}", retry_after=exc.retry_after) from exc
        case ItemAction.RETRY_TRANSIENT:
            metrics.RETRIES.labels("transient").inc()
            raise TransientError(f"{where}: {exc}") from exc
        case ItemAction.FAIL_AUTH:
            metrics.AUTH_FAILURES.inc()
            metrics.DEAD_LETTERS.labels("auth").inc()
            raise PermanentError(f"{where}: upstream refused our credentials: {exc}") from exc
        case _:
            metrics.DEAD_LETTERS.labels("permanent").inc()
            raise PermanentError(f"{where}: {exc}") from exc


def item_handler(engine: SyncEngine) -> Handler:
    """The `upload.sync.item` handler bound to `engine`."""

    async def handle(ctx: JobContext) -> None:
        outcome = await sync_item(engine, ctx)
        ctx.effect = {"outcome": outcome}

    return handle
