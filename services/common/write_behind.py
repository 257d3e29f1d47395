"""Writes a shared transaction makes once, at its end, for all its units.

A group commit's units each write what nothing in the transaction reads back: the outbox
event, the change log's rows, the audit row, the bump of a folder's listing version, and
the rows a small file's commit inserts (its file, its upload), which only another unit's
check could read. The name check and the quota check look at the file rows still to be
written (`pending`);
a request id stored twice is refused by its unique index when the group writes them, and
the group committer then runs the units again, each in a savepoint, where the later one
finds the earlier one's row. Written as they come, a group of sixteen small files runs
each of those statements sixteen times; written behind, once a kind, just before the
COMMIT. On PostgreSQL each saved statement is a round trip made under the tenant's tree
lock, which the next group waits for.

`write(session, batch, item)` writes at once, in a session nobody made write behind: one
item, the same statement, so every other caller is unchanged. A batch that needs what its
statements answer (a value for the session's objects) reads it after the flush's pipeline
ends (`when_answered`), not in the middle of it: on PostgreSQL a wait there is a round
trip under the tenant's tree lock. The group committer makes
its transactions write behind (`behind`) and owns the rest: it writes a unit's items
(`flush`) before that unit's savepoint is released, or the whole group's before its
COMMIT; it drops a failed unit's (`discard`) with its savepoint.

A batch runs after every unit of the group has taken its locks. One that locks rows (the
change log's head, a folder's row) takes them in key order; every writer of a tenant's tree
holds the tenant's tree lock first (`tree.lock_tree`), so the order is never crossed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from services.common.session_sql import SessionStatement, pipelined

Item = TypeVar("Item")

# session.info: the items written behind so far, per batch in the order first written.
_PENDING = "serentak.write_behind"
# session.info, during `flush`: what to run once the flush's statements are answered.
_ANSWERED = "serentak.write_behind.answered"


class Batch(Protocol[Item]):
    """A kind of write that takes many items in one go."""

    async def write(self, session: AsyncSession, items: list[Item]) -> None:
        """Write `items` (in the order given) in `session`'s transaction."""


class Rows:
    """Rows of one INSERT (`statement`), each a mapping of its values, written together."""

    def __init__(self, statement: SessionStatement) -> None:
        self._statement = statement

    async def write(self, session: AsyncSession, items: list[Mapping[str, Any]]) -> None:
        """Insert every row of `items`."""
        await self._statement.execute_many(session, items)


async def write(session: AsyncSession, batch: Batch[Item], item: Item) -> None:
    """Write `item` with `batch` in `session`'s transaction: now, or with the rest of the
    batch at the end when the transaction writes behind (module docstring)."""
    pending: dict[Batch[Any], list[Any]] | None = session.info.get(_PENDING)
    if pending is None:
        await batch.write(session, [item])
    else:
        pending.setdefault(batch, []).append(item)


def pending(session: AsyncSession, batch: Batch[Item]) -> list[Item]:
    """The items of `batch` written behind in `session` and not written yet (a check in the
    same transaction that must see them, as it would see their rows)."""
    waiting: dict[Batch[Any], list[Any]] | None = session.info.get(_PENDING)
    return list(waiting.get(batch, ())) if waiting else []


def behind(session: AsyncSession) -> None:
    """Make `session`'s transaction write behind until it ends (the group committer's)."""
    session.info[_PENDING] = {}


async def flush(session: AsyncSession) -> None:
    """Write what was written behind so far, batch by batch, pipelined on PostgreSQL (one
    round trip where a batch needs an answer before its next statement, and one at the
    end); then what the batches left for their answers (`when_answered`)."""
    pending: dict[Batch[Any], list[Any]] | None = session.info.get(_PENDING)
    if not pending:
        return
    answered: list[Callable[[], Awaitable[None]]] = []
    session.info[_ANSWERED] = answered
    try:
        async with pipelined(session):
            while pending:
                batch = next(iter(pending))
                items = pending.pop(batch)
                await batch.write(session, items)
    finally:
        del session.info[_ANSWERED]
    for then in answered:
        await then()


async def when_answered(session: AsyncSession, then: Callable[[], Awaitable[None]]) -> None:
    """Run `then` once the statements a batch sent have their answers: after the flush's
    pipeline ends (no round trip of their own), or now outside a flush."""
    answered: list[Callable[[], Awaitable[None]]] | None = session.info.get(_ANSWERED)
    if answered is None:
        await then()
    else:
        answered.append(then)


def discard(session: AsyncSession) -> None:
    """Drop what was written behind and not flushed (its savepoint rolled back)."""
    pending: dict[Batch[Any], list[Any]] | None = session.info.get(_PENDING)
    if pending:
        pending.clear()
