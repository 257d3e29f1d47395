"""Reads kept for the rest of a session's transaction.

A group commit runs many small files' units in one transaction, and most of them read the
same rows: the folder they go into, who may write it, who sees what it holds. A memo keeps
such a read for the transaction it was made in (a new transaction, or a new session after
a rollback, starts empty), so the units after the first do not read it again.

Only what no unit of such a transaction changes belongs here: a caller documents why its
entry holds until the transaction ends.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession


def transaction_memo(session: AsyncSession, name: str) -> dict[Any, Any]:
    """The memo `name` of `session`'s current (outermost) transaction: empty in a new one."""
    transaction = session.sync_session.get_transaction()
    key = f"serentak.memo.{name}"
    held = session.info.get(key)
    if held is None or held[0] is not transaction:
        held = session.info[key] = (transaction, {})
    memo: dict[Any, Any] = held[1]
    return memo
