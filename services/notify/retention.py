"""Retention: a periodic sweep purges read notifications and finished inbox rows.

Unread notifications are never purged (the badge counts them). A purged inbox row only
means a very late redelivery of that event is no longer recognised by `event_id`; the
version order still skips it as old, so it has no effect either way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.logging import get_logger
from services.notify import metrics
from services.notify.clock import utcnow
from services.notify.models import InboxEvent, InboxStatus, Notification

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Purged:
    """Rows removed by one sweep."""

    notifications: int
    inbox_events: int


async def purge(
    sessions: async_sessionmaker[AsyncSession],
    *,
    read_older_than: timedelta,
    inbox_older_than: timedelta,
    now: datetime | None = None,
) -> Purged:
    """Delete notifications read before `now - read_older_than` and inbox rows finished
    before `now - inbox_older_than`, in one transaction."""
    now = now or utcnow()
    async with sessions() as session, session.begin():
        notes = await session.execute(
            delete(Notification).where(
                Notification.read_at.is_not(None), Notification.read_at < now - read_older_than
            )
        )
        inbox = await session.execute(
            delete(InboxEvent).where(
                InboxEvent.status != InboxStatus.PARKED,
                InboxEvent.finished_at < now - inbox_older_than,
            )
        )
    purged = Purged(notes.rowcount or 0, inbox.rowcount or 0)  # type: ignore[attr-defined]
    metrics.PURGED.labels("notifications").inc(purged.notifications)
    metrics.PURGED.labels("notify_inbox").inc(purged.inbox_events)
    log.info("retention_swept", notifications=purged.notifications, inbox=purged.inbox_events)
    return purged


class RetentionSweeper:
    """The background loop: one sweep every `interval`, forever (cancelled at shutdown)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        interval: timedelta,
        read_older_than: timedelta,
        inbox_older_than: timedelta,
    ) -> None:
        self._sessions = sessions
        self._interval = interval
        self._read_older_than = read_older_than
        self._inbox_older_than = inbox_older_than

    async def run(self) -> None:
        """Sweep, wait, repeat; a failed sweep is logged and retried next time."""
        while True:
            try:
                await purge(
                    self._sessions,
                    read_older_than=self._read_older_than,
                    inbox_older_than=self._inbox_older_than,
                )
            except Exception:
                log.exception("retention_sweep_failed")
            await asyncio.sleep(self._interval.total_seconds())
