"""The change log behind ListChanges: every change of the tree, per user it may concern.

`record_file_event` appends here in the change's own transaction, so the log holds exactly
what committed. One change gets one sequence number from the tenant's head row
(`file_change_heads`), taken with an UPDATE that locks the row until commit: numbers commit
in order per tenant, so a reader that saw seq n never later finds a smaller one (no gap
from a slower transaction, on PostgreSQL or SQLite). The tenant's tree lock is held
first (tree.lock_tree, taken before the change's first row), so the two locks are always
taken in the same order.

A change is written once per user whose view it may change: the item's audience after the
change, plus who could see it before (`seen_by`: a move's old audience) and the user a
share names (granted or revoked). A change to a folder that can change what is visible
below it (share, unshare, move, delete, restore) also writes a row for every item under it
(`via_folder`), so a reader never has to reconstruct a subtree as it was. A user named by
no row of a change could not see the item before it nor after it.

Waiting readers are woken after the commit (`subscribe`); the periodic
`upload.purge_changes` job deletes rows older than the retention and moves the tenant's
`purged_through`, past which a cursor is CURSOR_EXPIRED.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, String, bindparam, delete, func, insert, select, update
from sqlalchemy import event as sa_event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from services.common import write_behind
from services.common.jobs import Handler, JobContext, PeriodicSchedule
from services.common.session_sql import SessionStatement
from services.upload.files.permissions import MAX_DEPTH
from services.upload.models import FOLDER, ChangeHeadRow, ChangeRow, FileRow, utcnow

PURGE_CHANGES_JOB = "upload.purge_changes"
# Folder events that change what is visible below the folder.
SUBTREE_EVENTS = frozenset(
    {"file.moved", "file.deleted", "file.restored", "file.shared", "file.unshared"}
)
_PENDING = "serentak_changed_tenants"
_subscribers: list[Callable[[str], None]] = []


def subscribe(callback: Callable[[str], None]) -> Callable[[], None]:
    """Call `callback(tenant_id)` after each commit that logged a change; returns the undo."""
    _subscribers.append(callback)
    return lambda: _subscribers.remove(callback) if callback in _subscribers else None


def _next_seq_statement(dialect_insert: Any) -> Any:
    """Insert-or-increment the tenant's head by `:count` (row-locked until commit)."""
    head = ChangeHeadRow.__table__
    count = bindparam("count", type_=BigInteger)
    stmt = dialect_insert(head).values(
        tenant_id=bindparam("tenant_id", type_=String), last_seq=count, purged_through=0
    )
    return stmt.on_conflict_do_update(
        index_elements=["tenant_id"], set_={"last_seq": head.c.last_seq + count}
    )


# Built once per dialect: a statement made per call costs more than running it.
_NEXT_SEQ = SessionStatement(
    {
        "postgresql": _next_seq_statement(postgresql.insert),
        "sqlite": _next_seq_statement(sqlite.insert),
    }
)
# A row's number is its tenant's head, just moved by `_NEXT_SEQ` in this transaction, less
# `back`: read by the INSERT itself, so nothing waits for the head's answer in between.
_INSERT_CHANGE = SessionStatement(
    insert(ChangeRow.__table__).values(  # type: ignore[arg-type]
        seq=select(ChangeHeadRow.last_seq)
        .where(ChangeHeadRow.tenant_id == bindparam("head_tenant_id", type_=String))
        .scalar_subquery()
        - bindparam("back", type_=BigInteger)
    )
)


async def _below(session: AsyncSession, folder: FileRow) -> list[FileRow]:
    """Everything under `folder`, level by level (bounded by MAX_DEPTH)."""
    found: list[FileRow] = []
    level = [folder.id]
    for _ in range(MAX_DEPTH + 1):
        if not level:
            break
        rows = list(
            (
                await session.execute(
                    select(FileRow)
                    .where(FileRow.parent_id.in_(level), FileRow.tenant_id == folder.tenant_id)
                    .order_by(FileRow.id)
                )
            ).scalars()
        )
        found.extend(rows)
        level = [r.id for r in rows if r.kind == FOLDER]
    return found


async def append(
    session: AsyncSession,
    event_type: str,
    file: FileRow,
    users: Iterable[str],
    named: Iterable[str] = (),
) -> None:
    """Log the change of `file` (and, for a folder event that may, of everything under it)
    for `users` and the users a share `named`, in `session`'s transaction, which holds the
    tenant's tree lock already (`record_file_event` and sync's `tombstone_item` take it).
    In a group commit the numbers are taken and the rows written behind, for the group's
    changes together (`write_behind`), in the order they were logged."""
    named_users = frozenset(u for u in named if u)
    audience = sorted({u for u in users if u} | named_users)
    if not audience:
        return
    items = [(file.id, file.version, False)]
    if file.kind == FOLDER and event_type in SUBTREE_EVENTS:
        items.extend((row.id, row.version, True) for row in await _below(session, file))
    change = _Change(file.tenant_id, event_type, tuple(items), tuple(audience), named_users)
    await write_behind.write(session, _CHANGES, change)
    _after_commit(session, file.tenant_id)


@dataclass(frozen=True, slots=True)
class _Change:
    """One change to log: its items (id, version, via_folder) for each user of `audience`."""

    tenant_id: str
    event_type: str
    items: tuple[tuple[str, int, bool], ...]
    audience: tuple[str, ...]
    named: frozenset[str]
    at: datetime = field(default_factory=utcnow)


class _Changes:
    """Writes changes: one run of sequence numbers per tenant (tenants in key order: the
    head rows' locks), then one INSERT for all their rows."""

    async def write(self, session: AsyncSession, items: list[_Change]) -> None:
        counts: dict[str, int] = {}
        for change in items:
            counts[change.tenant_id] = counts.get(change.tenant_id, 0) + len(change.items)
        for tenant_id in sorted(counts):
            # Each row reads the head back itself (`_INSERT_CHANGE`): nothing waits for it.
            await _NEXT_SEQ.send(session, {"tenant_id": tenant_id, "count": counts[tenant_id]})
        # A change's numbers counted back from the head: the last of its tenant's run is 0.
        back = dict(counts)
        rows: list[dict[str, Any]] = []
        for change in items:
            back[change.tenant_id] -= len(change.items)
            behind = back[change.tenant_id] + len(change.items) - 1
            rows.extend(
                {
                    "tenant_id": change.tenant_id,
                    "head_tenant_id": change.tenant_id,
                    "back": behind - i,
                    "user_id": user,
                    "file_id": file_id,
                    "event_type": change.event_type,
                    "via_folder": via,
                    "named": user in change.named,
                    "version": version,
                    "created_at": change.at,
                }
                for i, (file_id, version, via) in enumerate(change.items)
                for user in change.audience
            )
        await _INSERT_CHANGE.execute_many(session, rows)


_CHANGES = _Changes()


def _after_commit(session: AsyncSession, tenant_id: str) -> None:
    """Wake this process's waiting readers once the change is committed (not before)."""
    info = session.info
    pending: set[str] | None = info.get(_PENDING)
    if pending is None:
        pending = info[_PENDING] = set()
        sa_event.listen(session.sync_session, "after_commit", _on_commit)
        sa_event.listen(session.sync_session, "after_rollback", _on_rollback)
    pending.add(tenant_id)


def _on_commit(session: Session) -> None:
    tenants = list(session.info.get(_PENDING, ()))
    session.info.get(_PENDING, set()).clear()
    for tenant in tenants:
        for callback in list(_subscribers):
            callback(tenant)


def _on_rollback(session: Session) -> None:
    session.info.get(_PENDING, set()).clear()


async def head(session: AsyncSession, tenant_id: str) -> tuple[int, int]:
    """The tenant's (last_seq, purged_through); (0, 0) before its first change."""
    row = (
        await session.execute(
            select(ChangeHeadRow.last_seq, ChangeHeadRow.purged_through).where(
                ChangeHeadRow.tenant_id == tenant_id
            )
        )
    ).one_or_none()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


async def purge_changes(
    sessions: async_sessionmaker[AsyncSession], retention: timedelta, now: datetime | None = None
) -> int:
    """Delete log rows older than `retention`, one tenant a transaction; returns rows deleted.

    The tenant's `purged_through` moves first, in the same transaction, so a cursor is
    either still served in full or refused as expired, never answered with a gap.
    """
    cutoff = (now or utcnow()) - retention
    async with sessions() as session:
        due = (
            await session.execute(
                select(ChangeRow.tenant_id, func.max(ChangeRow.seq))
                .where(ChangeRow.created_at < cutoff)
                .group_by(ChangeRow.tenant_id)
            )
        ).all()
    deleted = 0
    for tenant_id, through in due:
        async with sessions.begin() as session:
            await session.execute(
                update(ChangeHeadRow)
                .where(ChangeHeadRow.tenant_id == tenant_id, ChangeHeadRow.purged_through < through)
                .values(purged_through=through)
            )
            result = await session.execute(
                delete(ChangeRow).where(ChangeRow.tenant_id == tenant_id, ChangeRow.seq <= through)
            )
            deleted += int(getattr(result, "rowcount", 0) or 0)
    return deleted


def purge_changes_schedule(interval_seconds: float) -> PeriodicSchedule:
    """The periodic schedule of the change log purge."""
    return PeriodicSchedule(PURGE_CHANGES_JOB, interval_seconds)


def purge_changes_handler(retention: timedelta) -> Handler:
    """The `upload.purge_changes` handler."""

    async def handle(ctx: JobContext) -> None:
        if ctx.sessions is None:
            raise RuntimeError("the job runtime gives handlers a session factory")
        ctx.effect = {"rows": await purge_changes(ctx.sessions, retention)}

    return handle
