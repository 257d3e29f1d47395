"""Reading a user's own notifications: list (newest first), mark read, badge count.

Every query is scoped by the caller's (tenant, user), so another user's notifications
are unreachable: they are neither listed, counted nor marked (unknown ids are ignored
rather than reported, which would reveal that they exist).

The badge is `COUNT(*) ... WHERE read_at IS NULL` over an index, not a counter: it
equals the number of unread notifications by construction, whatever runs concurrently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.auth import Identity
from services.common.errors import InvalidArgument
from services.notify.clock import utcnow
from services.notify.models import Notification, UserStream

MAX_MARK_IDS = 1000
_NOTIFICATION_ID_LEN = 32


@dataclass(frozen=True, slots=True)
class Page:
    """One page of notifications, newest first; `next_before` is None on the last page."""

    rows: list[Notification]
    next_before: int | None


def _own(identity: Identity) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    return (Notification.tenant_id == identity.tenant_id, Notification.user_id == identity.user_id)


async def list_page(
    session: AsyncSession,
    identity: Identity,
    *,
    page_size: int,
    before_seq: int | None,
    unread_only: bool,
) -> Page:
    """Up to `page_size` of the caller's notifications with seq < `before_seq`, newest first."""
    query = select(Notification).where(*_own(identity))
    if before_seq is not None:
        query = query.where(Notification.seq < before_seq)
    if unread_only:
        query = query.where(Notification.read_at.is_(None))
    rows = list(await session.scalars(query.order_by(Notification.seq.desc()).limit(page_size + 1)))
    more = len(rows) > page_size
    rows = rows[:page_size]
    return Page(rows, rows[-1].seq if more else None)


async def unread_count(session: AsyncSession, identity: Identity) -> int:
    """The caller's badge: how many of their notifications are unread."""
    count = await session.scalar(
        select(func.count())
        .select_from(Notification)
        .where(*_own(identity), Notification.read_at.is_(None))
    )
    return int(count or 0)


def check_notification_ids(ids: Sequence[str]) -> list[str]:
    """Validate MarkRead ids (INVALID_ARGUMENT naming `notification_ids`)."""
    if len(ids) > MAX_MARK_IDS:
        raise InvalidArgument("notification_ids", f"at most {MAX_MARK_IDS} ids per call")
    for nid in ids:
        if len(nid) != _NOTIFICATION_ID_LEN or not all(c in "0123456789abcdef" for c in nid):
            raise InvalidArgument("notification_ids", f"not a notification id: {nid[:64]!r}")
    return sorted(set(ids))


async def mark_read(
    session: AsyncSession,
    identity: Identity,
    *,
    notification_ids: Sequence[str],
    up_to_seq: int | None,
) -> int:
    """Mark the caller's unread notifications read, by id and/or up to a cursor; returns
    how many changed (already read or foreign ids count zero)."""
    marked = 0
    now = utcnow()
    unread = (*_own(identity), Notification.read_at.is_(None))
    if notification_ids:
        result = await session.execute(
            update(Notification)
            .where(*unread, Notification.notification_id.in_(list(notification_ids)))
            .values(read_at=now)
        )
        marked += result.rowcount or 0  # type: ignore[attr-defined]
    if up_to_seq is not None:
        result = await session.execute(
            update(Notification).where(*unread, Notification.seq <= up_to_seq).values(read_at=now)
        )
        marked += result.rowcount or 0  # type: ignore[attr-defined]
    return marked


async def read_after(
    session: AsyncSession, tenant_id: str, user_id: str, after_seq: int, limit: int
) -> list[Notification]:
    """The user's notifications with seq > `after_seq`, oldest first (stream replay)."""
    rows = await session.scalars(
        select(Notification)
        .where(
            Notification.tenant_id == tenant_id,
            Notification.user_id == user_id,
            Notification.seq > after_seq,
        )
        .order_by(Notification.seq)
        .limit(limit)
    )
    return list(rows)


async def stream_positions(
    session: AsyncSession, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], int]:
    """The last committed seq of each (tenant, user) that has one (absent: 0)."""
    rows = await session.execute(
        select(UserStream.tenant_id, UserStream.user_id, UserStream.last_seq).where(
            tuple_(UserStream.tenant_id, UserStream.user_id).in_(list(keys))
        )
    )
    return {(r.tenant_id, r.user_id): int(r.last_seq or 0) for r in rows}
