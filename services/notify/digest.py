"""Digest: a burst of events sharing a `dedupe_key` becomes one notification.

Rule. An event folds into a user's existing notification when all of these hold:
- the event type is digestible (`summaries.DIGESTIBLE_PAYLOADS`: renames, moves — the
  newest one states the whole situation); content changes are never folded;
- the notification is that user's latest one for this file (nothing else about the file
  came in between, so folding never reorders what the user sees);
- same non-empty `dedupe_key` and same event type;
- still unread (a read notification is history; news gets a fresh one);
- the event occurred less than the window after the burst's first event
  (`window_started_at`): the window is fixed from the first event, so a steady trickle
  cannot keep one notification open forever. Event time, not arrival time, decides, so a
  redelivery later on folds exactly as the first delivery would have.

A fold rewrites the notification to the latest state (version, name, summary, event id),
adds one to `digest_count`, and gives it the next `seq` of the user's stream, so an open
Subscribe stream sees the update with a new cursor and the same `notification_id`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from serentak.events.v1 import events_pb2
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from services.notify.models import Notification
from services.notify.sql import batches


def mergeable(
    latest: Notification, event: events_pb2.Event, occurred_at: datetime, window: timedelta
) -> bool:
    """Whether `event` folds into `latest` (the user's latest notification for the file)."""
    return (
        bool(event.dedupe_key)
        and latest.dedupe_key == event.dedupe_key
        and latest.event_type == event.event_type
        and latest.read_at is None
        and latest.version < event.version
        and occurred_at - latest.window_started_at < window
    )


async def latest_for_file(
    session: AsyncSession, tenant_id: str, file_id: str, user_ids: Sequence[str]
) -> dict[str, Notification]:
    """Each user's latest notification about `file_id`, locked until commit (PostgreSQL) so a
    concurrent MarkRead cannot slip between the unread check and the fold."""
    found: dict[str, Notification] = {}
    newer = aliased(Notification)
    for chunk in batches(user_ids):
        latest_seq = (
            select(func.max(newer.seq))
            .where(
                newer.tenant_id == Notification.tenant_id,
                newer.user_id == Notification.user_id,
                newer.file_id == Notification.file_id,
            )
            .scalar_subquery()
        )
        rows = await session.scalars(
            select(Notification)
            .where(
                Notification.tenant_id == tenant_id,
                Notification.file_id == file_id,
                Notification.user_id.in_(chunk),
                Notification.seq == latest_seq,
            )
            .order_by(Notification.user_id)
            .with_for_update(of=Notification)
        )
        found.update((row.user_id, row) for row in rows)
    return found
