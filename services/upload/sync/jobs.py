"""The sync engine's job types on the job runtime, and how they are enqueued.

| job type               | partition            | what it does                                  |
| ---------------------- | -------------------- | --------------------------------------------- |
| `upload.sync.item`     | `sync-item:{id}`     | GET one item, apply invariant 14              |
| `upload.sync.delta`    | `sync-drive:{id}`    | follow a drive's delta; full resync on 410    |
| `upload.sync.reconcile`| periodic             | poll every drive, tombstone expired offline   |
| `upload.sync.purge`    | periodic             | drop tombstones past retention, in batches    |
| `upload.sync.subscription` | `sync-drive:{id}` | create/renew/recreate a subscription |
| `upload.sync.subscriptions` | periodic        | queue the above for drives due a renewal      |
| `upload.sync.unsubscribe` | `sync-unsub:{id}` | delete an unlinked drive's subscription       |

Delta polls carry `dedupe_key = delta:{drive_id}`: webhook bursts collapse into one poll;
a full re-enumeration (after `subscriptionRemoved`) has its own `delta-full:{drive_id}`,
so it never folds into an ordinary poll.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.job import NewJob
from services.common.jobs.periodic import PeriodicSchedule
from services.common.jobs.queue import enqueue
from services.common.jobs.retry import RetryPolicy
from services.upload.sync.settings import SyncSettings

ITEM_JOB = "upload.sync.item"
DELTA_JOB = "upload.sync.delta"
RECONCILE_JOB = "upload.sync.reconcile"
PURGE_JOB = "upload.sync.purge"
SUBSCRIPTION_JOB = "upload.sync.subscription"
SUBSCRIPTIONS_JOB = "upload.sync.subscriptions"
UNSUBSCRIBE_JOB = "upload.sync.unsubscribe"
# What a subscription job does: ensure (create if none, renew if due), renew (now: a
# reauthorization), recreate (the provider dropped it).
ENSURE, RENEW, RECREATE = "ensure", "renew", "recreate"


def item_partition(item_id: str) -> str:
    """One item's jobs run one at a time, in order."""
    return f"sync-item:{item_id}"


def delta_dedupe_key(drive_id: str) -> str:
    """Webhooks and polls for one drive inside the window become one delta poll."""
    return f"delta:{drive_id}"


async def enqueue_item_sync(
    session: AsyncSession,
    item_id: str,
    *,
    reason: str,
    run_after: datetime | None = None,
    context: dict[str, str] | None = None,
) -> str:
    """Queue a sync of one item (collapses into one already queued and not started).

    `context` (upstream ids, tenant) travels in the payload so a dead letter is readable
    on its own.
    """
    return await enqueue(
        session,
        NewJob(
            job_type=ITEM_JOB,
            payload={"item_id": item_id, "reason": reason, **(context or {})},
            partition_key=item_partition(item_id),
            idempotency_key=f"{ITEM_JOB}:{item_id}:{uuid.uuid4().hex}",
            dedupe_key=f"item:{item_id}" if run_after is None else None,
            run_after=run_after,
        ),
    )


async def enqueue_delta_poll(
    session: AsyncSession,
    drive_id: str,
    *,
    reason: str,
    dedupe_window_seconds: float,
    full: bool = False,
) -> str:
    """Queue a delta poll of one linked drive; polls inside the window collapse.

    `full`: enumerate from scratch (ignore the stored cursor) and re-check unseen items.
    """
    return await enqueue(
        session,
        NewJob(
            job_type=DELTA_JOB,
            payload={"drive_id": drive_id, "reason": reason, "full": full},
            partition_key=f"sync-drive:{drive_id}",
            idempotency_key=f"{DELTA_JOB}:{drive_id}:{uuid.uuid4().hex}",
            dedupe_key=f"delta-full:{drive_id}" if full else delta_dedupe_key(drive_id),
            dedupe_window_seconds=dedupe_window_seconds,
        ),
    )


async def enqueue_subscription(
    session: AsyncSession, drive_id: str, *, action: str, reason: str, dedupe_window_seconds: float
) -> str:
    """Queue a subscription job for one drive; the same action inside the window collapses."""
    return await enqueue(
        session,
        NewJob(
            job_type=SUBSCRIPTION_JOB,
            payload={"drive_id": drive_id, "action": action, "reason": reason},
            partition_key=f"sync-drive:{drive_id}",
            idempotency_key=f"{SUBSCRIPTION_JOB}:{drive_id}:{uuid.uuid4().hex}",
            dedupe_key=f"subscription:{action}:{drive_id}",
            dedupe_window_seconds=dedupe_window_seconds,
        ),
    )


async def enqueue_unsubscribe(session: AsyncSession, tenant_id: str, subscription_id: str) -> str:
    """Queue the deletion of a subscription whose drive link is gone (ids in the payload)."""
    return await enqueue(
        session,
        NewJob(
            job_type=UNSUBSCRIBE_JOB,
            payload={"tenant_id": tenant_id, "subscription_id": subscription_id},
            partition_key=f"sync-unsub:{subscription_id}",
            idempotency_key=f"{UNSUBSCRIBE_JOB}:{tenant_id}:{subscription_id}",
        ),
    )


def transient_policy(settings: SyncSettings) -> RetryPolicy:
    """Retries of 429/5xx/timeouts (Retry-After is a floor on the delay)."""
    return RetryPolicy(
        max_attempts=settings.transient_max_attempts,
        base_seconds=settings.transient_backoff_base_seconds,
        cap_seconds=settings.transient_backoff_cap_seconds,
    )


def periodic_schedules(settings: SyncSettings) -> list[PeriodicSchedule]:
    """Reconciliation poll, purge and subscription renewals, for the PeriodicScheduler."""
    schedules = [
        PeriodicSchedule(RECONCILE_JOB, settings.reconcile_interval_seconds),
        PeriodicSchedule(PURGE_JOB, settings.purge_interval_seconds),
    ]
    if settings.subscriptions_enabled:
        schedules.append(
            PeriodicSchedule(SUBSCRIPTIONS_JOB, settings.subscription_interval_seconds)
        )
    return schedules
