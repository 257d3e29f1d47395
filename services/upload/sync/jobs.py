"""The sync engine's job types on the job runtime, and how they are enqueued.

| job type               | partition            | what it does                                  |
| ---------------------- | -------------------- | --------------------------------------------- |
| `upload.sync.item`     | `sync-item:{id}`     | GET one item, apply invariant 14              |
| `upload.sync.delta`    | `sync-drive:{id}`    | follow a drive's delta; full resync on 410    |
| `upload.sync.reconcile`| periodic             | poll every drive, tombstone expired offline   |
| `upload.sync.purge`    | periodic             | drop tombstones past retention, in batches    |

Delta polls carry `dedupe_key = delta:{drive_id}`: webhook bursts collapse into one poll.
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
    session: AsyncSession, drive_id: str, *, reason: str, dedupe_window_seconds: float
) -> str:
    """Queue a delta poll of one linked drive; polls inside the window collapse."""
    return await enqueue(
        session,
        NewJob(
            job_type=DELTA_JOB,
            payload={"drive_id": drive_id, "reason": reason},
            partition_key=f"sync-drive:{drive_id}",
            idempotency_key=f"{DELTA_JOB}:{drive_id}:{uuid.uuid4().hex}",
            dedupe_key=delta_dedupe_key(drive_id),
            dedupe_window_seconds=dedupe_window_seconds,
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
    """Reconciliation poll and purge, for the service's PeriodicScheduler."""
    return [
        PeriodicSchedule(RECONCILE_JOB, settings.reconcile_interval_seconds),
        PeriodicSchedule(PURGE_JOB, settings.purge_interval_seconds),
    ]
