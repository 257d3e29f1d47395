"""SQL that must read the same on SQLite and PostgreSQL: insert-or-ignore, and the retry
of a transaction that PostgreSQL aborted to break a deadlock or a serialization conflict."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.db import is_disconnect
from services.common.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")
# PostgreSQL: deadlock_detected, serialization_failure. Both mean "nothing happened, rerun".
_RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
TRANSACTION_ATTEMPTS = 5
# Bound on rows per statement: stays under SQLite's and PostgreSQL's parameter limits.
BATCH_ROWS = 400


def upsert(session: AsyncSession, model: Any) -> Any:
    """The session dialect's INSERT, which has `on_conflict_do_update/_nothing`."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model)
    return sqlite.insert(model)


def insert_ignore(session: AsyncSession, model: Any) -> Any:
    """`INSERT ... ON CONFLICT DO NOTHING` for `model` in the session's dialect."""
    return upsert(session, model).on_conflict_do_nothing()


def retryable(exc: DBAPIError) -> bool:
    """True when the database rolled the transaction back to break a deadlock or a
    serialization conflict: nothing happened, running it again is safe."""
    return getattr(exc.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES


async def retrying(transaction: Callable[[], Awaitable[T]]) -> T:
    """Run `transaction` (which opens and commits its own) again when the database
    rolled it back to resolve a deadlock or serialization conflict, and once when its
    connection was lost: notify's engine does not ping connections at checkout
    (`components.py`), so a connection the server dropped fails its first statement,
    and the pool hands the rerun a new one. Every notify transaction is safe to rerun
    after a loss at COMMIT: Ingest is idempotent by event_id, the rest read or mark read."""
    reconnected = False
    attempt = 0
    while True:
        attempt += 1
        try:
            return await transaction()
        except DBAPIError as exc:
            if is_disconnect(exc) and not reconnected:
                reconnected = True
                log.info("transaction_retried", attempt=attempt, reason="connection_lost")
                continue
            if not retryable(exc) or attempt >= TRANSACTION_ATTEMPTS:
                raise
            log.info("transaction_retried", attempt=attempt, sqlstate=exc.orig.sqlstate)  # type: ignore[union-attr]


def batches(items: Sequence[T], size: int = BATCH_ROWS) -> Iterator[Sequence[T]]:
    """`items` in consecutive slices of at most `size`."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
