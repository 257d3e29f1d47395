"""Recognising a full disk, whoever reports it: the kernel (ENOSPC, EDQUOT), SQLite
("database or disk is full") or PostgreSQL (SQLSTATE 53100 disk_full).

A full disk is not a bug: the caller gets RESOURCE_EXHAUSTED / STORAGE_FULL (and may retry
later), not INTERNAL. The error mapping (rpc_status.py) asks `as_storage_full` about every exception
that is not already a domain error, so every service and every write path is covered.
"""

from __future__ import annotations

import errno
import sqlite3

from services.common.errors import ResourceExhausted, causes

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_PG_DISK_FULL = "53100"


class StorageFull(ResourceExhausted):
    """The disk (or quota) under a blob store or database is full."""

    reason = "STORAGE_FULL"


def _is_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return True
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or (
            "database or disk is full" in str(exc)
        )
    return getattr(exc, "sqlstate", None) == _PG_DISK_FULL


def as_storage_full(exc: BaseException) -> StorageFull | None:
    """STORAGE_FULL if `exc` (or what it wraps: SQLAlchemy's `.orig`, causes) is a full disk."""
    if any(_is_full(cause) for cause in causes(exc)):
        return StorageFull("no space left on the server's storage; retry later")
    return None
