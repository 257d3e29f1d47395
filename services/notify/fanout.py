"""Fan-out: one applied event becomes at most one notification per audience user.

Audience. The upload service carries it in the event (`Event.audience_user_ids`: the
file's owner and collaborators at commit time), so notify never reads a state newer than
the event and needs no call back to the upload service. The actor is excluded.

Exactly once per (user, file, version). The fan-out job (`fanout_job.py`) writes each
accepted event's notifications once, in the same transaction as its idempotency record
and the event's inbox status; the UNIQUE (tenant, user, file, version) constraint backs
it up.

Per-user order. Each notification takes the next `seq` of its user's stream row, which
stays locked until commit, so one user's notifications (and their badge) change one
transaction at a time, in `seq` order. Users are locked in sorted order, so two fan-outs
sharing users cannot deadlock; a transaction applying several events locks the union of
their audiences up front.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2
from sqlalchemy import String, Table, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.session_sql import FEW_ROWS, SessionStatement, SessionStatements
from services.notify import cursors, digest
from services.notify.messages import row_message
from services.notify.models import Notification, UserStream
from services.notify.notification_ids import new_notification_id
from services.notify.retirement import is_terminal
from services.notify.sql import batches, insert_ignore, upsert
from services.notify.summaries import Description

# Core tables, not ORM entities: a fan-out writes hundreds of rows per event, and the ORM's
# per-row bookkeeping (identity map, bulk-by-primary-key paths) was most of its cost.
NOTIFICATIONS: Table = Notification.__table__  # type: ignore[assignment]
STREAMS: Table = UserStream.__table__  # type: ignore[assignment]
# Columns a digest fold rewrites with the event's state (the same for every user).
_FOLDED_STATE = (
    "version",
    "event_type",
    "event_id",
    "actor_user_id",
    "file_name",
    "summary",
    "updated_at",
    "correlation_id",
)
_STREAM_SEQ = (
    select(STREAMS.c.last_seq)
    .where(
        STREAMS.c.tenant_id == NOTIFICATIONS.c.tenant_id,
        STREAMS.c.user_id == NOTIFICATIONS.c.user_id,
    )
    .scalar_subquery()
)
# One statement folds the event into every user's digest: the per-user values are derived
# in SQL (the seq just taken from the user's locked stream row, the count plus one), so
# the event's state is bound once instead of once per user.
_FOLD = (
    update(NOTIFICATIONS)
    .where(NOTIFICATIONS.c.notification_id.in_(bindparam("v_ids", expanding=True)))
    .values(
        seq=_STREAM_SEQ,
        digest_count=NOTIFICATIONS.c.digest_count + 1,
        read_at=None,
        **{name: bindparam(f"v_{name}") for name in _FOLDED_STATE},
    )
)


class EventTemplate:
    """The part of an event's notification every recipient shares, built once (on first
    use) and copied into each recipient's message: a fan-out's rows differ only in
    `notification_id`, `user_id` and the cursor."""

    __slots__ = ("_message", "state")

    def __init__(self, state: dict[str, Any]) -> None:
        # The event's column values, shared by every recipient's row.
        self.state = state
        self._message: notify_pb2.Notification | None = None

    def response(self, row: dict[str, Any]) -> notify_pb2.SubscribeResponse:
        """The stream item for `row` (one recipient's own columns: id, user, seq)."""
        if self._message is None:
            self._message = row_message({**self.state, **row})
        response = notify_pb2.SubscribeResponse()
        message = response.notification
        message.CopyFrom(self._message)
        cursor = cursors.encode(row["seq"])
        message.notification_id = row["notification_id"]
        message.user_id = row["user_id"]
        message.cursor = cursor
        response.cursor = cursor
        return response


class Written:
    """A notification created or updated by a fan-out, ready to publish after commit.

    Its stream item is built on first use only: most users of a large audience have no
    open stream, and building 1,000 messages per event nobody reads was a hot spot. Rows
    of one event written by the one-statement path share an `EventTemplate`, so the
    event's common fields are encoded once, not once per recipient; their `row` then holds
    only the recipient's own columns (id, tenant, user, seq).
    """

    __slots__ = ("_message", "_template", "merged", "row", "seq", "tenant_id", "user_id")

    def __init__(
        self, row: dict[str, Any], *, merged: bool, template: EventTemplate | None = None
    ) -> None:
        self.row = row
        self.tenant_id: str = row["tenant_id"]
        self.user_id: str = row["user_id"]
        self.seq: int = row["seq"]
        self.merged = merged
        self._template = template
        self._message: notify_pb2.Notification | None = None

    def response(self) -> notify_pb2.SubscribeResponse:
        """The Subscribe stream item (build it once per user: its streams share it)."""
        if self._template is not None:
            return self._template.response(self.row)
        if self._message is None:
            self._message = row_message(self.row)
        return notify_pb2.SubscribeResponse(notification=self._message, cursor=self._message.cursor)


@dataclass
class FanOutResult:
    """What one fan-out did."""

    written: list[Written]
    duplicates: int = 0


def new_notification_state(
    event: events_pb2.Event, described: Description, occurred_at: datetime, now: datetime
) -> dict[str, Any]:
    """The columns every recipient's new (not folded) notification of `event` shares:
    all but its id, user and seq."""
    return {
        "tenant_id": event.tenant_id,
        "file_id": described.file_id,
        "version": event.version,
        "event_type": event.event_type,
        "event_id": event.event_id,
        "actor_user_id": event.actor_user_id,
        "file_name": described.file_name,
        "summary": described.summary,
        "dedupe_key": event.dedupe_key,
        "digest_count": 1,
        "window_started_at": occurred_at,
        "created_at": now,
        "updated_at": now,
        "read_at": None,
        "correlation_id": event.correlation_id,
    }


def audience(event: events_pb2.Event) -> list[str]:
    """The users to notify: distinct, sorted (the lock order), actor excluded; nobody for
    a terminal event."""
    if is_terminal(event):
        return []  # a purge tells nobody: the deletion was announced when it happened
    users = set(event.audience_user_ids)
    users.discard(event.actor_user_id)
    users.discard("")
    return sorted(users)


async def lock_streams(session: AsyncSession, tenant_id: str, user_ids: Sequence[str]) -> None:
    """Create missing stream rows of `user_ids` and lock them all, in sorted order, until
    commit. Call it once per transaction with every user it will notify: locking in one
    global order is what keeps two fan-outs sharing users from deadlocking."""
    users = sorted(set(user_ids))
    s = STREAMS.c
    for chunk in batches(users):
        await session.execute(
            insert_ignore(session, STREAMS),
            [{"tenant_id": tenant_id, "user_id": u, "last_seq": 0} for u in chunk],
        )
    for chunk in batches(users):
        await session.execute(
            select(s.user_id)
            .where(s.tenant_id == tenant_id, s.user_id.in_(chunk))
            .order_by(s.user_id)
            .with_for_update()
        )


async def next_seqs(
    session: AsyncSession, tenant_id: str, user_ids: Sequence[str]
) -> dict[str, int]:
    """Take the next stream position of each user, creating missing stream rows: one
    upsert per batch, rows visited (and, on PostgreSQL, locked) in sorted order."""
    seqs: dict[str, int] = {}
    s = STREAMS.c
    ordered = sorted(user_ids)
    if len(ordered) <= FEW_ROWS:
        # A few users (a small file's audience): one statement built once per count.
        values = {"tenant_id": tenant_id, **{f"user_{i}": u for i, u in enumerate(ordered)}}
        return dict(await _NEXT_SEQS.of(len(ordered)).rows(session, values))
    # Parameters as a list, not .values([...]): SQLAlchemy compiles the statement once and
    # renders the rows into one multi-row INSERT itself ("insertmanyvalues"), in order.
    stmt = (
        upsert(session, STREAMS)
        .on_conflict_do_update(
            index_elements=[s.tenant_id, s.user_id], set_={"last_seq": s.last_seq + 1}
        )
        .returning(s.user_id, s.last_seq)
    )
    for chunk in batches(ordered):
        rows = await session.execute(
            stmt, [{"tenant_id": tenant_id, "user_id": u, "last_seq": 1} for u in chunk]
        )
        seqs.update({user_id: seq for user_id, seq in rows})
    return seqs


def _next_seqs(dialect_insert: Any, count: int) -> Any:
    """The upsert taking the next position of `count` users (`user_i`, sorted) of
    `tenant_id`, in one statement."""
    s = STREAMS.c
    stmt = dialect_insert(STREAMS).values(
        [
            {
                "tenant_id": bindparam("tenant_id", type_=String),
                "user_id": bindparam(f"user_{i}", type_=String),
                "last_seq": 1,
            }
            for i in range(count)
        ]
    )
    return stmt.on_conflict_do_update(
        index_elements=[s.tenant_id, s.user_id], set_={"last_seq": s.last_seq + 1}
    ).returning(s.user_id, s.last_seq)


_NEXT_SEQS = SessionStatements(
    lambda n: {
        "postgresql": _next_seqs(postgresql.insert, n),
        "sqlite": _next_seqs(sqlite.insert, n),
    }
)


def _insert_rows(dialect_insert: Any, columns: tuple[str, ...], count: int) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING of `count` notification rows of `columns`
    (`{column}_{i}`), returning the ids stored."""
    rows = [
        {k: bindparam(f"{k}_{i}", type_=NOTIFICATIONS.c[k].type) for k in columns}
        for i in range(count)
    ]
    return (
        dialect_insert(NOTIFICATIONS)
        .values(rows)
        .on_conflict_do_nothing()
        .returning(NOTIFICATIONS.c.notification_id)
    )


# By (row count, columns): built once each.
_INSERT_ROWS: dict[tuple[int, tuple[str, ...]], SessionStatement] = {}


async def _insert_notifications(
    session: AsyncSession, rows: Sequence[dict[str, object]]
) -> set[str]:
    """Insert `rows` (notifications, all with the same columns), skipping ones stored
    before; the ids stored. A few rows go in one statement built once per count."""
    if len(rows) <= FEW_ROWS:
        columns = tuple(sorted(rows[0]))
        statement = _INSERT_ROWS.get((len(rows), columns))
        if statement is None:
            statement = _INSERT_ROWS[(len(rows), columns)] = SessionStatement(
                {
                    "postgresql": _insert_rows(postgresql.insert, columns, len(rows)),
                    "sqlite": _insert_rows(sqlite.insert, columns, len(rows)),
                }
            )
        values = {f"{k}_{i}": row[k] for i, row in enumerate(rows) for k in columns}
        return {nid for (nid,) in await statement.rows(session, values)}
    stored = await session.execute(
        insert_ignore(session, NOTIFICATIONS).returning(NOTIFICATIONS.c.notification_id),
        list(rows),
    )
    return {nid for (nid,) in stored}


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

    Taking the users' next seqs locks their stream rows in sorted order; a transaction
    that fans out several events locks the union first (`lock_streams`)."""
    users = audience(event)
    if not users:
        return FanOutResult(written=[])
    tenant = event.tenant_id
    seqs = await next_seqs(session, tenant, users)
    latest: dict[str, Row[Any]] = {}
    if described.digestible and event.dedupe_key:
        latest = await digest.latest_for_file(session, tenant, described.file_id, users)
    # The event's columns: a new notification's as they are; a fold keeps the digest's
    # own id, dedupe key, window and creation time, counts one more, and takes the rest
    # (unread again; the statement writes `_FOLDED_STATE`).
    fresh = new_notification_state(event, described, occurred_at, now)
    merges: list[dict[str, object]] = []
    inserts: list[dict[str, object]] = []
    result = FanOutResult(written=[])
    for user in users:
        previous = latest.get(user)
        if previous is not None and digest.mergeable(previous, event, occurred_at, window):
            merges.append(
                {
                    **fresh,
                    "notification_id": previous.notification_id,
                    "seq": seqs[user],
                    "digest_count": previous.digest_count + 1,
                    "user_id": user,
                    "dedupe_key": previous.dedupe_key,
                    "window_started_at": previous.window_started_at,
                    "created_at": previous.created_at,
                }
            )
        else:
            inserts.append(
                {
                    **fresh,
                    "notification_id": new_notification_id(),
                    "user_id": user,
                    "seq": seqs[user],
                }
            )
    if merges:
        for chunk in batches(merges):
            await session.execute(
                _FOLD,
                {
                    "v_ids": [m["notification_id"] for m in chunk],
                    **{f"v_{k}": fresh[k] for k in _FOLDED_STATE},
                },
            )
        result.written.extend(Written(m, merged=True) for m in merges)
    for chunk in batches(inserts):
        kept = await _insert_notifications(session, chunk)
        result.duplicates += len(chunk) - len(kept)
        result.written.extend(
            Written(dict(i), merged=False) for i in chunk if i["notification_id"] in kept
        )
    return result
