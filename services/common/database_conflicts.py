"""Recognising a transaction that failed through no fault of the caller's: a deadlock
(SQLSTATE 40P01) or a serialization failure (40001) PostgreSQL chose to fail so another
could go on, or a lost database connection.

The lock order (tree.lock_tree and the like) keeps conflicts from happening; if one happens
anyway it is not the caller's fault and not lost data (the transaction rolled back whole),
so the caller gets ABORTED / TRANSACTION_CONFLICT and may retry, not INTERNAL. The error
is still logged as a bug, since an order somewhere is wrong. A connection the server
dropped (a restart, a failover, `pg_terminate_backend`) is UNAVAILABLE /
DATABASE_UNAVAILABLE: the transaction did not commit unless the loss came at its COMMIT (a
retry with the same request id finds it then), and the pool's other connections are
replaced or pinged before the retry uses one (`pool_pings`).
"""

from __future__ import annotations

from services.common.db import is_disconnect
from services.common.errors import Aborted, Unavailable, causes

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


class DatabaseUnavailable(Unavailable):
    """The database connection was lost during the call (module docstring)."""

    reason = "DATABASE_UNAVAILABLE"


def as_connection_lost(exc: BaseException) -> DatabaseUnavailable | None:
    """DATABASE_UNAVAILABLE if `exc` (or what it wraps) is a lost database connection."""
    for cause in causes(exc):
        if is_disconnect(cause):
            return DatabaseUnavailable(
                "the connection to the database was lost; retry (with the same"
                " client_request_id, a retry finds what this call may have stored)"
            )
    return None
