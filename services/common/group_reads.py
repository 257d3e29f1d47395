"""Reads a group commit's units make together (services/common/group_commit.py).

Sixteen new files committed in one transaction each check that their name is free and
that their tenant has room: sixteen times the same two reads, one after another, under the
tenant's tree lock. A unit that says what it will read (`GroupCommits.run(...,
reads={reader: key, ...})`) lets the first of a run of such units read for all of them at once
(`read`): the others find their answer kept for them.

An answer read for a later unit must be the one that unit would read itself, after the
units before it. It is, while nothing is written straight in the transaction: a unit that
declares reads writes only behind (`write_behind`, whose rows its checks count as they do
unbatched: `versions.pending_file_named`, `pending_file_bytes`). So the group drops the
answers before a unit that declares none (it may write anything), and declares nothing to
units run in savepoints (each writes its rows before the next runs) or alone: they read
for themselves. A reader documents why its answers hold under that rule.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from services.common.transaction_memo import transaction_memo

# session.info: the group's declared reads ({reader: key}, or None, per unit) and the
# index of the unit running now.
_DECLARED = "serentak.group_reads.declared"
_MEMO = "group_reads"


class GroupReader(Protocol):
    """A read many units need, made for many keys in one go."""

    async def read(self, session: AsyncSession, keys: Sequence[Any]) -> Mapping[Any, Any]:
        """The answer for `keys[0]`, read in `session`'s transaction, and for as many of
        the other `keys` (distinct) as the transaction's locks keep current until it
        ends: the answers kept must be the ones a later read would get."""


Declared = Mapping[GroupReader, Hashable]


def declare(session: AsyncSession, reads: Sequence[Declared | None]) -> None:
    """The group committer's: `reads` are its units' declared reads, in the order they
    run (None: the unit declared none)."""
    session.info[_DECLARED] = (reads, 0)


def running(session: AsyncSession, index: int) -> None:
    """The group committer's: unit `index` runs now. One that declared no reads may write
    anything, so the answers read so far are dropped."""
    declared = session.info.get(_DECLARED)
    if declared is None:
        return
    session.info[_DECLARED] = (declared[0], index)
    if declared[0][index] is None:
        transaction_memo(session, _MEMO).clear()


async def read(session: AsyncSession, reader: GroupReader, key: Hashable) -> Any:
    """`reader`'s answer for `key` in `session`'s transaction: kept from the read the run's
    first unit made for it and the units after it that declared the same reader, or read
    now (for them too, up to the first unit that declared no reads). Outside a group's
    shared transaction, a read of `key` alone."""
    declared = session.info.get(_DECLARED)
    if declared is None or declared[0][declared[1]] is None:
        # Not in a group, or for a unit that may write straight: none of it is kept.
        return (await reader.read(session, [key]))[key]
    memo: dict[Any, Any] = transaction_memo(session, _MEMO).setdefault(reader, {})
    if key in memo:
        return memo[key]
    reads, index = declared
    keys = {key: None}
    for unit_reads in reads[index:]:
        if unit_reads is None:
            break
        later = unit_reads.get(reader)
        if later is not None and later not in memo:
            keys.setdefault(later, None)
    memo.update(await reader.read(session, list(keys)))
    return memo[key]
