"""The fencing pattern: storage, not the lock, has the last word.

A lock can be lost without its holder noticing in time (a GC pause, a stalled disk, a
network partition longer than the TTL). The next holder's token is strictly greater, so
every write made under a lock carries the token and the database refuses a token older
than the newest it has seen, in the same statement that makes the write:

    UPDATE files
       SET last_lock_token = :token, size = :size, version = version + 1, ...
     WHERE id = :file_id
       AND last_lock_token <= :token      -- equal: the same holder writing again

One row updated: the write went through and the row now remembers `:token`. Zero rows:
either the row does not exist or a newer holder has written; the caller re-reads and
answers ABORTED / STALE_FENCING_TOKEN. The column starts at 0 (no lock seen yet).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.errors import Aborted


class StaleFencingToken(Aborted):
    """A write carried an older lock token than the row has seen (ABORTED)."""

    reason = "STALE_FENCING_TOKEN"


async def commit_fenced(
    session: AsyncSession,
    table: Table,
    row_id: Any,
    token: int,
    values: dict[str, Any],
    *,
    id_column: str = "id",
    token_column: str = "last_lock_token",
) -> None:
    """Apply `values` to one row iff `token` is not older than its `token_column`.

    Runs inside the caller's transaction (the caller commits). Raises StaleFencingToken
    when a newer holder has already written, or the row is missing.
    """
    fenced = table.c[token_column]
    stmt = (
        update(table)
        .where(table.c[id_column] == row_id, fenced <= token)
        .values({token_column: token, **values})
    )
    result = await session.execute(stmt)
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise StaleFencingToken(
            "a newer lock holder has written this row", row_id=row_id, token=token
        )
