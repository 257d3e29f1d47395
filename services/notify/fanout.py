"""Fan-out: one applied event becomes at most one notification per audience user.

Audience. The upload service carries it in the event (`Event.audience_user_ids`: the
file's owner and collaborators at commit time), so notify never reads a state newer than
the event and needs no call back to the upload service. The actor is excluded.

Exactly once per (user, file, version). The caller applies each aggregate version once,
under the aggregate's row lock, in the same transaction as the inbox row (see
`inbox.py`); the UNIQUE (tenant, user, file, version) constraint backs it up.

Per-user order. Each notification takes the next `seq` of its user's stream row, which
stays locked until commit, so one user's notifications (and their badge) change one
transaction at a time, in `seq` order. Users are locked in sorted order, so two fan-outs
sharing users cannot deadlock; a transaction applying several events locks the union of
their audiences up front.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace

from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.notify import digest
from services.notify.messages import to_message
from services.notify.models import Notification, UserStream
from services.notify.sql import batches, insert_ignore
from services.notify.summaries import Description


@dataclass(frozen=True, slots=True)
class Written:
    """A notification created or updated by a fan-out, ready to publish after commit."""

    tenant_id: str
    user_id: str
    seq: int
    message: notify_pb2.Notification
    merged: bool


@dataclass
class FanOutResult:
    """What one fan-out did."""

    written: list[Written]
    duplicates: int = 0


def audience(event: events_pb2.Event) -> list[str]:
    """The users to notify: distinct, sorted (the lock order), actor excluded."""
    return sorted({u for u in event.audience_user_ids if u and u != event.actor_user_id})


async def lock_streams(session: AsyncSession, tenant_id: str, user_ids: Sequence[str]) -> None:
    """Create missing stream rows of `user_ids` and lock them all, in sorted order, until
    commit. Call it once per transaction with every user it will notify: locking in one
    global order is what keeps two fan-outs sharing users from deadlocking."""
    users = sorted(set(user_ids))
    for chunk in batches(users):
        await session.execute(
            insert_ignore(session, UserStream),
            [{"tenant_id": tenant_id, "user_id": u, "last_seq": 0} for u in chunk],
        )
    for chunk in batches(users):
        await session.execute(
            select(UserStream.user_id)
            .where(UserStream.tenant_id == tenant_id, UserStream.user_id.in_(chunk))
            .order_by(UserStream.user_id)
            .with_for_update()
        )


async def next_seqs(
    session: AsyncSession, tenant_id: str, user_ids: Sequence[str]
) -> dict[str, int]:
    """The next stream position of each user (rows already locked by `lock_streams`)."""
    seqs: dict[str, int] = {}
    for chunk in batches(user_ids):
        rows = await session.execute(
            update(UserStream)
            .where(UserStream.tenant_id == tenant_id, UserStream.user_id.in_(chunk))
            .values(last_seq=UserStream.last_seq + 1)
            .returning(UserStream.user_id, UserStream.last_seq)
        )
        seqs.update({user_id: seq for user_id, seq in rows})
    return seqs


async def fan_out(
    session: AsyncSession,
    event: events_pb2.Event,
    described: Description,
    *,
    occurred_at: datetime,
    now: datetime,
    window: timedelta,
) -> FanOutResult:
    """Write (or fold into a digest) the notification of every audience user of `event`.

    The audience's stream rows must already be locked (`lock_streams`)."""
    users = audience(event)
    if not users:
        return FanOutResult(written=[])
    tenant = event.tenant_id
    seqs = await next_seqs(session, tenant, users)
    latest: dict[str, Notification] = {}
    if described.digestible and event.dedupe_key:
        latest = await digest.latest_for_file(session, tenant, described.file_id, users)
    state = {
        "file_id": described.file_id,
        "version": event.version,
        "event_type": event.event_type,
        "event_id": event.event_id,
        "actor_user_id": event.actor_user_id,
        "file_name": described.file_name,
        "summary": described.summary,
        "updated_at": now,
        "correlation_id": event.correlation_id,
    }
    merges: list[dict[str, object]] = []
    inserts: list[dict[str, object]] = []
    result = FanOutResult(written=[])
    for user in users:
        previous = latest.get(user)
        if previous is not None and digest.mergeable(previous, event, occurred_at, window):
            merges.append(
                {
                    **state,
                    "notification_id": previous.notification_id,
                    "seq": seqs[user],
                    "digest_count": previous.digest_count + 1,
                    "tenant_id": tenant,
                    "user_id": user,
                    "dedupe_key": previous.dedupe_key,
                    "window_started_at": previous.window_started_at,
                    "created_at": previous.created_at,
                    "read_at": None,
                }
            )
        else:
            inserts.append(
                {
                    **state,
                    "notification_id": uuid.uuid4().hex,
                    "tenant_id": tenant,
                    "user_id": user,
                    "seq": seqs[user],
                    "dedupe_key": event.dedupe_key,
                    "digest_count": 1,
                    "window_started_at": occurred_at,
                    "created_at": now,
                    "read_at": None,
                }
            )
    if merges:
        columns = ("notification_id", "seq", "digest_count", *state)
        await session.execute(update(Notification), [{k: m[k] for k in columns} for m in merges])
        result.written.extend(_written(m, merged=True) for m in merges)
    for chunk in batches(inserts):
        stored = await session.scalars(
            insert_ignore(session, Notification).returning(Notification.notification_id),
            list(chunk),
        )
        kept = set(stored)
        result.duplicates += len(chunk) - len(kept)
        result.written.extend(
            _written(i, merged=False) for i in chunk if i["notification_id"] in kept
        )
    return result


def _written(row: dict[str, object], *, merged: bool) -> Written:
    message = to_message(SimpleNamespace(**row))
    return Written(str(row["tenant_id"]), str(row["user_id"]), int(row["seq"]), message, merged)  # type: ignore[call-overload]
