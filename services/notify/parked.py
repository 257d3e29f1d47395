"""Parked events: how many wait in the inbox for a missing earlier version, and how long.

A parked event needs no resend — the transaction that accepts its predecessor accepts it
too — so a gap that never fills (an upstream event lost for good, a producer bug) shows
nowhere else. These gauges make it visible: `serentak_notify_parked_events`,
`serentak_notify_parked_files` and `serentak_notify_parked_oldest_age_seconds` (alert
when the age keeps growing).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.logging import get_logger
from services.notify import metrics
from services.notify.clock import utcnow
from services.notify.models import InboxEvent, InboxStatus

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ParkedStats:
    """Parked events at one instant."""

    events: int
    files: int
    oldest_age_seconds: float


async def parked_stats(session: AsyncSession, now: datetime | None = None) -> ParkedStats:
    """Count parked events and files, and the age of the oldest parked event."""
    now = now or utcnow()
    events, files, oldest = (
        await session.execute(
            select(
                func.count(),
                func.count(func.distinct(InboxEvent.aggregate_id)),
                func.min(InboxEvent.received_at),
            ).where(InboxEvent.status == InboxStatus.PARKED)
        )
    ).one()
    if isinstance(oldest, str):  # SQLite returns MIN() over a timestamp as text
        oldest = datetime.fromisoformat(oldest)
    age = max((now - oldest).total_seconds(), 0.0) if oldest is not None else 0.0
    return ParkedStats(int(events or 0), int(files or 0), age)


async def sample_parked(sessions: async_sessionmaker[AsyncSession]) -> ParkedStats:
    """Read the stats and set the gauges."""
    async with sessions() as session:
        stats = await parked_stats(session)
    metrics.PARKED_EVENTS.set(stats.events)
    metrics.PARKED_FILES.set(stats.files)
    metrics.PARKED_OLDEST_AGE.set(stats.oldest_age_seconds)
    return stats


class ParkedSampler:
    """Refreshes the parked gauges every `interval` seconds in each replica (a gauge is
    per process; every replica reports the same shared inbox)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], interval: float) -> None:
        self._sessions = sessions
        self._interval = interval

    async def run(self) -> None:
        """Sample, wait, repeat until cancelled; a failed sample is logged."""
        while True:
            try:
                stats = await sample_parked(self._sessions)
                if stats.events:
                    log.info(
                        "parked_events",
                        events=stats.events,
                        files=stats.files,
                        oldest_age_seconds=round(stats.oldest_age_seconds, 1),
                    )
            except Exception:
                log.exception("parked_sample_failed")
            # A timer between samples, not synchronisation.
            await asyncio.sleep(self._interval)
