"""Queue statistics: depth and lag per job type, dead letters, outbox age.

Shared by the AdminService's QueueStats and the metrics sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.dead_letters import count_dead_letters
from services.common.jobs.models import QUEUED, RUNNING, WAITING, jobs, utcnow
from services.common.outbox.store import oldest_unpublished


@dataclass(frozen=True, slots=True)
class JobTypeStats:
    """One job type's queue."""

    job_type: str
    queued: int = 0
    running: int = 0
    lag_seconds: float = 0.0
    dead_letters: int = 0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The whole runtime at one instant."""

    job_types: list[JobTypeStats] = field(default_factory=list)
    unpublished_events: int = 0
    oldest_unpublished_event_age_seconds: float = 0.0
    dead_letter_count: int = 0


def _aware(value: datetime | str | None) -> datetime | None:
    # SQLite returns MIN() over a timestamp column as text.
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=utcnow().tzinfo)
    return value


async def queue_stats(session: AsyncSession) -> QueueStats:
    """Depth, running count and lag per job type, dead letters and the outbox's age."""
    now = utcnow()
    # A job waiting behind its partition's head is queued and lagging all the same.
    unclaimed = jobs.c.status.in_((QUEUED, WAITING))
    due_unclaimed = unclaimed & (jobs.c.run_after <= now)
    stmt = select(
        jobs.c.job_type,
        func.sum(case((unclaimed, 1), else_=0)),
        func.sum(case((jobs.c.status == RUNNING, 1), else_=0)),
        func.min(case((due_unclaimed, jobs.c.run_after), else_=None)),
    ).group_by(jobs.c.job_type)
    rows = list(await session.execute(stmt))
    dead = await count_dead_letters(session)
    per_type: dict[str, JobTypeStats] = {}
    for job_type, queued, running, oldest_due in rows:
        oldest = _aware(oldest_due)
        lag = max((now - oldest).total_seconds(), 0.0) if oldest else 0.0
        per_type[job_type] = JobTypeStats(
            job_type, int(queued or 0), int(running or 0), lag, dead.get(job_type, 0)
        )
    for job_type, n in dead.items():
        per_type.setdefault(job_type, JobTypeStats(job_type, dead_letters=n))
    unpublished, oldest_event = await oldest_unpublished(session)
    age = max((now - oldest_event).total_seconds(), 0.0) if oldest_event else 0.0
    return QueueStats(
        job_types=[per_type[k] for k in sorted(per_type)],
        unpublished_events=unpublished,
        oldest_unpublished_event_age_seconds=age,
        dead_letter_count=sum(dead.values()),
    )
