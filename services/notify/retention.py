"""Retention: a periodic job purges read notifications, unread ones past their own (longer)
retention, finished inbox rows, and retired aggregates (`retirement.py`).

The job runtime's periodic scheduler enqueues `notify_retention` once per
`retention_interval_seconds` across all replicas (`PeriodicSchedule`); the sweep runs in
the job's transaction like any other job, with its retries and dead letters.

Unread notifications go only after `unread_older_than` (SERENTAK_UNREAD_RETENTION_SECONDS,
180 days; 0 keeps them until read): the badge is a count of what is left, so it drops with
them. A redelivery that could bring one back cannot come that late: the upload service's
outbox purges published events within days. A purged inbox row only
means a very late redelivery of that event is no longer recognised by `event_id`; the
version order still skips it as old, so it has no effect either way. A retired
aggregate's row (the file was purged upstream) goes after
`retired_older_than` (SERENTAK_RETIRED_AGGREGATE_RETENTION_SECONDS, 30 days), with any
parked event of it: by then no redelivery of its events can arrive to find it gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.jobs import JobContext, PeriodicSchedule
from services.common.logging import get_logger
from services.notify import metrics
from services.notify.clock import utcnow
from services.notify.models import InboxEvent, InboxStatus, Notification
from services.notify.retirement import purge_retired

log = get_logger(__name__)

RETENTION_JOB = "notify_retention"


@dataclass(frozen=True, slots=True)
class Purged:
    """Rows removed by one sweep."""

    notifications: int
    inbox_events: int
    retired_aggregates: int = 0


async def purge(
    sessions: async_sessionmaker[AsyncSession],
    *,
    read_older_than: timedelta,
    inbox_older_than: timedelta,
    unread_older_than: timedelta | None = None,
    retired_older_than: timedelta | None = None,
    now: datetime | None = None,
) -> Purged:
    """`purge_in` in a transaction of its own."""
    async with sessions() as session, session.begin():
        return await purge_in(
            session,
            read_older_than=read_older_than,
            inbox_older_than=inbox_older_than,
            unread_older_than=unread_older_than,
            retired_older_than=retired_older_than,
            now=now,
        )


async def purge_in(
    session: AsyncSession,
    *,
    read_older_than: timedelta,
    inbox_older_than: timedelta,
    unread_older_than: timedelta | None = None,
    retired_older_than: timedelta | None = None,
    now: datetime | None = None,
) -> Purged:
    """Delete notifications read before `now - read_older_than`, unread ones created before
    `now - unread_older_than` (None: none), inbox rows finished before
    `now - inbox_older_than`, and aggregates retired before `now - retired_older_than`
    (None: none) with their parked events, in the caller's transaction. Other parked
    events stay, and so do accepted ones whose fan-out has not run yet."""
    now = now or utcnow()
    notes = await session.execute(
        delete(Notification).where(
            Notification.read_at.is_not(None), Notification.read_at < now - read_older_than
        )
    )
    unread_gone = 0
    if unread_older_than is not None:
        unread = await session.execute(
            delete(Notification).where(
                Notification.read_at.is_(None), Notification.created_at < now - unread_older_than
            )
        )
        unread_gone = unread.rowcount or 0  # type: ignore[attr-defined]
    inbox = await session.execute(
        delete(InboxEvent).where(
            InboxEvent.status.in_([InboxStatus.NOTIFIED, InboxStatus.SKIPPED_OLD]),
            InboxEvent.finished_at < now - inbox_older_than,
        )
    )
    retired = parked = 0
    if retired_older_than is not None:
        retired, parked = await purge_retired(session, retired_older_than, now)
    purged = Purged(
        (notes.rowcount or 0) + unread_gone,  # type: ignore[attr-defined]
        (inbox.rowcount or 0) + parked,  # type: ignore[attr-defined]
        retired,
    )
    metrics.PURGED.labels("notifications").inc(purged.notifications)
    metrics.PURGED.labels("notify_inbox").inc(purged.inbox_events)
    metrics.PURGED.labels("notify_aggregate_versions").inc(purged.retired_aggregates)
    log.info(
        "retention_swept",
        notifications=purged.notifications,
        inbox=purged.inbox_events,
        retired_aggregates=purged.retired_aggregates,
    )
    return purged


class RetentionJob:
    """Job handler of `notify_retention`: one sweep in the job's transaction."""

    def __init__(
        self,
        *,
        read_older_than: timedelta,
        inbox_older_than: timedelta,
        unread_older_than: timedelta | None = None,
        retired_older_than: timedelta | None = None,
    ) -> None:
        self._read_older_than = read_older_than
        self._inbox_older_than = inbox_older_than
        self._unread_older_than = unread_older_than
        self._retired_older_than = retired_older_than

    async def __call__(self, ctx: JobContext) -> None:
        """Purge what has aged out; the counts are stored with the job's idempotency key."""
        purged = await purge_in(
            ctx.session,
            read_older_than=self._read_older_than,
            inbox_older_than=self._inbox_older_than,
            unread_older_than=self._unread_older_than,
            retired_older_than=self._retired_older_than,
        )
        ctx.effect = {
            "notifications": purged.notifications,
            "inbox_events": purged.inbox_events,
            "retired_aggregates": purged.retired_aggregates,
        }


def retention_schedule(interval_seconds: float) -> PeriodicSchedule:
    """Run the sweep once every `interval_seconds`, on one replica per tick."""
    return PeriodicSchedule(RETENTION_JOB, interval_seconds)
