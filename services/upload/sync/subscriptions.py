"""Change subscriptions of linked drives: create, renew before expiry, recreate.

The provider only posts change notifications while a subscription lives, and it expires
(Graph: days). `upload.sync.subscriptions` runs every `subscription_interval_seconds` and
queues an `upload.sync.subscription` job ("ensure") for each drive with none, or one
expiring within `subscription_renew_before_seconds` (a setting that must exceed the
interval, so every subscription is seen while still renewable). Lifecycle notifications
queue "renew" (reauthorizationRequired) or "recreate" (subscriptionRemoved).

A subscription job reads the drive in a short transaction, makes the upstream call with
no transaction open, then writes the new id and expiry in its own. A renewal the provider
answers 404 (it forgot the subscription) becomes a create. 429 retries after Retry-After,
5xx and timeouts retry with backoff, 401/403 are permanent (dead letter, counted as auth
failures like every sync call). Only tenants with a credential are subscribed.
UnlinkDrive queues `upload.sync.unsubscribe` (DELETE upstream; 404 is success). A drive
unlinked while its subscription job ran keeps nothing either: that subscription lapses
upstream, and its notifications are refused (the clientState of a link that is gone
matches no subscription we know, and is not the shared secret).
"""

from __future__ import annotations

from datetime import timedelta
from typing import NoReturn

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.job import Handler, JobContext
from services.common.logging import get_logger
from services.upload.sync import items, metrics
from services.upload.sync.drive_errors import raise_for_drive
from services.upload.sync.engine import SyncEngine
from services.upload.sync.jobs import ENSURE, RECREATE, enqueue_subscription
from services.upload.sync.models import linked_drives, utcnow
from services.upload.sync.notifications import client_state_for
from services.upload.sync.provider import Subscription, UpstreamError

log = get_logger(__name__)


def notification_urls(engine: SyncEngine) -> tuple[str, str]:
    """Where the provider posts change and lifecycle notifications."""
    settings = engine.settings
    base = settings.webhook_public_url.rstrip("/")
    return base + settings.webhook_path, base + settings.webhook_lifecycle_path


async def queue_due(engine: SyncEngine, session: AsyncSession) -> dict[str, int]:
    """Queue an "ensure" job for every drive without a subscription or due a renewal."""
    settings = engine.settings
    if not settings.subscriptions_enabled:
        return {"queued": 0}
    due = utcnow() + timedelta(seconds=settings.subscription_renew_before_seconds)
    rows = (
        await session.execute(
            select(linked_drives.c.id, linked_drives.c.tenant_id).where(
                or_(
                    linked_drives.c.subscription_id.is_(None),
                    linked_drives.c.subscription_expires_at.is_(None),
                    linked_drives.c.subscription_expires_at <= due,
                )
            )
        )
    ).all()
    queued = 0
    for drive_id, tenant_id in rows:
        if not settings.provider_configured(tenant_id):
            continue
        await enqueue_subscription(
            session,
            drive_id,
            action=ENSURE,
            reason="periodic",
            dedupe_window_seconds=settings.webhook_dedupe_seconds,
        )
        queued += 1
    return {"queued": queued, "due": len(rows)}


def _raise_for(exc: UpstreamError, operation: str, drive_id: str) -> NoReturn:
    metrics.SUBSCRIPTION_OPERATIONS.labels(operation, "failed").inc()
    raise_for_drive(exc, f"subscription {operation} for drive {drive_id}")


async def run_subscription(engine: SyncEngine, ctx: JobContext) -> str:
    """One subscription job (see the module docstring); returns its outcome."""
    settings = engine.settings
    drive_id, action = ctx.payload["drive_id"], ctx.payload.get("action", ENSURE)
    if not settings.subscriptions_enabled:
        return "disabled"
    if ctx.sessions is not None:
        async with ctx.sessions() as session:
            drive = await items.load_drive(session, drive_id)
    else:
        drive = await items.load_drive(ctx.session, drive_id)
    if drive is None:
        return "unlinked"
    now = utcnow()
    current, expires = drive["subscription_id"], drive["subscription_expires_at"]
    renew_by = now + timedelta(seconds=settings.subscription_renew_before_seconds)
    if action == ENSURE and current and expires is not None and expires > renew_by:
        return "fresh"
    want = now + timedelta(seconds=settings.subscription_lifetime_seconds)
    operation = "create" if action == RECREATE or not current else "renew"
    sub: Subscription | None = None
    if operation == "renew":
        try:
            sub = await engine.provider.renew_subscription(drive["tenant_id"], current, want)
        except UpstreamError as exc:
            if exc.status != 404:
                _raise_for(exc, operation, drive_id)
            metrics.SUBSCRIPTION_OPERATIONS.labels("renew", "not_found").inc()
            operation = "create"  # the provider forgot it: make a new one
    if sub is None:
        change_url, lifecycle_url = notification_urls(engine)
        try:
            sub = await engine.provider.create_subscription(
                drive["tenant_id"],
                drive["upstream_drive_id"],
                notification_url=change_url,
                lifecycle_url=lifecycle_url,
                client_state=client_state_for(
                    settings.client_state, drive["tenant_id"], drive["id"]
                ),
                expires_at=want,
            )
        except UpstreamError as exc:
            _raise_for(exc, operation, drive_id)
    metrics.SUBSCRIPTION_OPERATIONS.labels(operation, "ok").inc()
    stored = await ctx.session.execute(
        update(linked_drives)
        .where(linked_drives.c.id == drive_id)
        .values(
            subscription_id=sub.id,
            subscription_expires_at=sub.expires_at or want,
            updated_at=utcnow(),
        )
    )
    if not stored.rowcount:  # type: ignore[attr-defined]
        return "unlinked"
    log.info(
        "sync_subscription_stored",
        drive_id=drive_id,
        operation=operation,
        action=action,
        subscription_id=sub.id,
        expires_at=(sub.expires_at or want).isoformat(),
    )
    return "created" if operation == "create" else "renewed"


async def unsubscribe(engine: SyncEngine, ctx: JobContext) -> str:
    """Delete an unlinked drive's subscription upstream (already gone: done)."""
    tenant_id, sub_id = ctx.payload["tenant_id"], ctx.payload["subscription_id"]
    try:
        await engine.provider.delete_subscription(tenant_id, sub_id)
    except UpstreamError as exc:
        if exc.status != 404:
            _raise_for(exc, "delete", sub_id)
        metrics.SUBSCRIPTION_OPERATIONS.labels("delete", "not_found").inc()
        return "already_gone"
    metrics.SUBSCRIPTION_OPERATIONS.labels("delete", "ok").inc()
    return "deleted"


def unsubscribe_handler(engine: SyncEngine) -> Handler:
    """The `upload.sync.unsubscribe` handler bound to `engine`."""

    async def handle(ctx: JobContext) -> None:
        ctx.effect = {"outcome": await unsubscribe(engine, ctx)}

    return handle


def subscription_handler(engine: SyncEngine) -> Handler:
    """The `upload.sync.subscription` handler bound to `engine`."""

    async def handle(ctx: JobContext) -> None:
        ctx.effect = {"outcome": await run_subscription(engine, ctx)}

    return handle


def subscriptions_handler(engine: SyncEngine) -> Handler:
    """The periodic `upload.sync.subscriptions` handler bound to `engine`."""

    async def handle(ctx: JobContext) -> None:
        ctx.effect = await queue_due(engine, ctx.session)

    return handle
