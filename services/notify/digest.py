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
from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import Table, func, select
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncSession

from services.notify.models import Notification
from services.notify.sql import batches

NOTIFICATIONS: Table = Notification.__table__  # type: ignore[assignment]


def mergeable(
    latest: Row[Any], event: events_pb2.Event, occurred_at: datetime, window: timedelta
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
) -> dict[str, Any]:
    """Each user's latest notification about `file_id` (the columns `mergeable` and a fold
    need), locked until commit (PostgreSQL) so a concurrent MarkRead cannot slip between
    the unread check and the fold. One statement per batch of users, plain rows."""
    found: dict[str, Any] = {}
    n = NOTIFICATIONS.c
    newer = NOTIFICATIONS.alias("newer")
    for chunk in batches(user_ids):
        # The highest version is the latest: a user's notifications about one file take
        # versions and stream positions in the same order (migration notify_0004), and
        # UNIQUE (tenant, user, file, version) answers it from its index.
        latest_version = (
            select(func.max(newer.c.version))
            .where(
                newer.c.tenant_id == n.tenant_id,
                newer.c.user_id == n.user_id,
                newer.c.file_id == n.file_id,
            )
            .scalar_subquery()
        )
        rows = await session.execute(
            select(
                n.user_id,
                n.notification_id,
                n.dedupe_key,
                n.event_type,
                n.read_at,
                n.version,
                n.window_started_at,
                n.created_at,
                n.digest_count,
            )
            .where(
                n.tenant_id == tenant_id,
                n.file_id == file_id,
                n.user_id.in_(chunk),
                n.version == latest_version,
            )
            .order_by(n.user_id)
            .with_for_update(of=NOTIFICATIONS)
        )
        found.update((row.user_id, row) for row in rows)
    return found
