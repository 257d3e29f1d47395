"""The `runtime_retention` job: the runtime's own tables stop growing.

Every service with a job runtime (upload, notify) schedules it every
`runtime_retention_interval_seconds` (one replica per tick). Each run deletes:

- outbox events published before `outbox_retention_seconds` ago. Unpublished events never
  go: the relay still owes them to subscribers, and order per aggregate needs them.
- applied-job records (idempotency keys) older than `applied_jobs_retention_seconds`. A key
  guards against a second effect of a redelivered or replayed job, so it is kept longer
  than any redelivery window: a lease (seconds), a retry's backoff (minutes), a dead
  letter's whole life (a replay checks the key; the settings refuse a shorter retention
  than the dead letters'). Finished jobs leave no row of their own (they are deleted at
  completion), and periodic ticks are trimmed by the scheduler.
- dead letters older than `dead_letter_retention_seconds`.
- audit rows older than `audit_retention_seconds`.

Deletes go `BATCH` rows at a time, each batch its own short transaction, so a large backlog
never holds one long transaction (or its locks) and a crash loses at most one batch's
progress. Counts go to `serentak_rows_purged_total{table}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.audit.trail import purge_statement as audit_purge
from services.common.config import CommonSettings
from services.common.jobs import (
    Handler,
    JobContext,
    JobRegistry,
    PeriodicSchedule,
    RetryPolicy,
    metrics,
)
from services.common.jobs.models import applied_jobs, dead_letters, utcnow
from services.common.logging import get_logger
from services.common.outbox.models import outbox_events

log = get_logger(__name__)

RUNTIME_RETENTION_JOB = "runtime_retention"
BATCH = 1000


@dataclass(frozen=True, slots=True)
class RuntimeRetention:
    """How long each table keeps its rows (seconds; from the service's settings)."""

    outbox_seconds: float = 7 * 86400
    applied_jobs_seconds: float = 30 * 86400
    dead_letter_seconds: float = 30 * 86400
    audit_seconds: float = 365 * 86400

    @classmethod
    def from_settings(cls, settings: CommonSettings) -> RuntimeRetention:
        """The policy of a `CommonSettings` (its `*_retention_seconds` fields)."""
        return cls(
            outbox_seconds=settings.outbox_retention_seconds,
            applied_jobs_seconds=settings.applied_jobs_retention_seconds,
            dead_letter_seconds=settings.dead_letter_retention_seconds,
            audit_seconds=settings.audit_retention_seconds,
        )


@dataclass
class RuntimePurged:
    """Rows deleted by one run, by table."""

    rows: dict[str, int] = field(default_factory=dict)


def _oldest(table: Any, *conditions: Any) -> Any:
    ids = select(table.c.id).where(*conditions).order_by(table.c.id).limit(BATCH)
    return delete(table).where(table.c.id.in_(ids))


async def _drain(sessions: async_sessionmaker[AsyncSession], statement: Any) -> int:
    """Run a batch delete until it deletes less than a batch; the rows deleted."""
    total = 0
    while True:
        async with sessions() as session, session.begin():
            deleted = int((await session.execute(statement)).rowcount or 0)  # type: ignore[attr-defined]
        total += deleted
        if deleted < BATCH:
            return total


async def purge_runtime(
    sessions: async_sessionmaker[AsyncSession],
    policy: RuntimeRetention,
    now: datetime | None = None,
) -> RuntimePurged:
    """One run of every deletion (module docstring)."""
    now = now or utcnow()

    def before(seconds: float) -> datetime:
        return now - timedelta(seconds=seconds)

    statements = {
        "outbox_events": _oldest(
            outbox_events,
            outbox_events.c.published_at.is_not(None),
            outbox_events.c.published_at < before(policy.outbox_seconds),
        ),
        "applied_jobs": _oldest(
            applied_jobs, applied_jobs.c.applied_at < before(policy.applied_jobs_seconds)
        ),
        "dead_letters": _oldest(
            dead_letters, dead_letters.c.dead_at < before(policy.dead_letter_seconds)
        ),
        "audit_events": audit_purge(before(policy.audit_seconds), BATCH),
    }
    purged = RuntimePurged()
    for table, statement in statements.items():
        purged.rows[table] = n = await _drain(sessions, statement)
        metrics.ROWS_PURGED.labels(table).inc(n)
    log.info("runtime_retention_swept", **purged.rows)
    return purged


def runtime_retention_handler(policy: RuntimeRetention) -> Handler:
    """The `runtime_retention` job's handler (its batches run in transactions of their own)."""

    async def handle(ctx: JobContext) -> None:
        if ctx.sessions is None:
            raise RuntimeError("the job runtime gives handlers a session factory")
        purged = await purge_runtime(ctx.sessions, policy)
        ctx.effect = dict(purged.rows)

    return handle


def runtime_retention_schedule(interval_seconds: float) -> PeriodicSchedule:
    """Run the retention job once every `interval_seconds`, on one replica per tick."""
    return PeriodicSchedule(RUNTIME_RETENTION_JOB, interval_seconds)


def register_runtime_retention(registry: JobRegistry, settings: CommonSettings) -> PeriodicSchedule:
    """Register the retention job with `settings`' policy; its schedule, for the runtime."""
    registry.register(
        RUNTIME_RETENTION_JOB,
        runtime_retention_handler(RuntimeRetention.from_settings(settings)),
        retry=RetryPolicy(max_attempts=3, base_seconds=5.0, cap_seconds=60.0),
    )
    return runtime_retention_schedule(settings.runtime_retention_interval_seconds)
