"""Periodic jobs: enqueue a job every `interval_seconds`, at most once per tick across replicas.

Ticks are numbered `floor(epoch_seconds / interval)`. Every replica's scheduler tries
to insert (job_type, tick) into periodic_ticks and enqueue the job in the same
transaction; the unique constraint lets exactly one succeed, the others roll back.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.jobs import metrics
from services.common.jobs.job import NewJob
from services.common.jobs.models import periodic_ticks, utcnow
from services.common.jobs.queue import enqueue
from services.common.logging import get_logger

log = get_logger(__name__)

# Tick rows older than this many ticks are deleted (they only guard the current tick).
KEEP_TICKS = 100


@dataclass(frozen=True, slots=True)
class PeriodicSchedule:
    """Run `job_type` every `interval_seconds` (payload gets the tick number as "tick")."""

    job_type: str
    interval_seconds: float
    payload: dict[str, Any] = field(default_factory=dict)

    def tick_at(self, epoch_seconds: float) -> int:
        """The tick that contains `epoch_seconds`."""
        return math.floor(epoch_seconds / self.interval_seconds)


async def schedule_tick(
    session: AsyncSession, schedule: PeriodicSchedule, tick: int, scheduler_id: str
) -> bool:
    """Claim `tick` and enqueue its job in the caller's transaction; False if taken."""
    dialect = session.get_bind().dialect.name
    dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = (
        dialect_insert(periodic_ticks)
        .values(
            job_type=schedule.job_type, tick=tick, scheduled_by=scheduler_id, scheduled_at=utcnow()
        )
        .on_conflict_do_nothing(index_elements=[periodic_ticks.c.job_type, periodic_ticks.c.tick])
        .returning(periodic_ticks.c.id)
    )
    if (await session.execute(stmt)).first() is None:
        return False
    await enqueue(
        session,
        NewJob(
            job_type=schedule.job_type,
            payload={**schedule.payload, "tick": tick},
            # One partition per periodic type: a slow run never overlaps the next one.
            partition_key=f"periodic:{schedule.job_type}",
            idempotency_key=f"periodic:{schedule.job_type}:{tick}",
        ),
    )
    await session.execute(
        delete(periodic_ticks).where(
            periodic_ticks.c.job_type == schedule.job_type,
            periodic_ticks.c.tick < tick - KEEP_TICKS,
        )
    )
    return True


class PeriodicScheduler:
    """Enqueues each schedule's job once per tick; run one on every replica."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        schedules: Sequence[PeriodicSchedule],
        *,
        scheduler_id: str,
    ) -> None:
        for s in schedules:
            if s.interval_seconds <= 0:
                raise ValueError(f"{s.job_type}: interval_seconds must be > 0")
        self.sessions = sessions
        self.schedules = list(schedules)
        self.scheduler_id = scheduler_id

    async def run_due(self, epoch_seconds: float | None = None) -> list[str]:
        """Try every schedule's current tick once; the job types this replica enqueued."""
        now = time.time() if epoch_seconds is None else epoch_seconds
        enqueued = []
        for schedule in self.schedules:
            tick = schedule.tick_at(now)
            try:
                async with self.sessions() as session, session.begin():
                    won = await schedule_tick(session, schedule, tick, self.scheduler_id)
            except Exception:
                log.exception("periodic_tick_failed", job_type=schedule.job_type, tick=tick)
                continue
            if won:
                metrics.PERIODIC_RUNS.labels(schedule.job_type).inc()
                log.info("periodic_tick_enqueued", job_type=schedule.job_type, tick=tick)
                enqueued.append(schedule.job_type)
        return enqueued

    async def run(self) -> None:
        """Forever: schedule the current ticks, then sleep until the next tick starts."""
        if not self.schedules:
            return
        while True:
            await self.run_due()
            now = time.time()
            # A timer, not synchronisation: wake at the earliest next tick boundary.
            wait = min((s.tick_at(now) + 1) * s.interval_seconds - now for s in self.schedules)
            await asyncio.sleep(max(wait, 0.01))
