"""Recognising a transaction PostgreSQL chose to fail so another could go on: a deadlock
(SQLSTATE 40P01) or a serialization failure (40001).

The lock order (tree.lock_tree and the like) keeps these from happening; if one happens
anyway it is not the caller's fault and not lost data (the transaction rolled back whole),
so the caller gets ABORTED / TRANSACTION_CONFLICT and may retry, not INTERNAL. The error
is still logged as a bug, since an order somewhere is wrong.
"""

from __future__ import annotations

from services.common.errors import Aborted, causes

_CONFLICT_STATES = {"40P01", "40001"}


class TransactionConflict(Aborted):
    """The database rolled this transaction back to resolve a conflict; retry it."""

    reason = "TRANSACTION_CONFLICT"


def as_transaction_conflict(exc: BaseException) -> TransactionConflict | None:
    """TRANSACTION_CONFLICT if `exc` (or what it wraps) is a deadlock or serialization failure."""
    for cause in causes(exc):
        if getattr(cause, "sqlstate", None) in _CONFLICT_STATES:
            return TransactionConflict(
                "the database rolled this change back to resolve a conflict; retry it"
            )
    return None
