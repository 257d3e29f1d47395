"""Which exceptions are a full disk (unit: no sockets, no disks)."""

from __future__ import annotations

import errno
import sqlite3

import psycopg.errors
from sqlalchemy.exc import OperationalError

from services.common.disk_full import StorageFull, as_storage_full


def test_full_disks_from_every_layer() -> None:
    wrapped = OperationalError(
        "INSERT ...", {}, sqlite3.OperationalError("database or disk is full")
    )
    caused = RuntimeError("write failed")
    caused.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    for exc in (
        OSError(errno.ENOSPC, "No space left on device"),
        caused,
        wrapped,
        OperationalError("INSERT ...", {}, psycopg.errors.DiskFull("could not extend file")),
    ):
        found = as_storage_full(exc)
        assert isinstance(found, StorageFull), exc
        assert found.reason == "STORAGE_FULL"
    for exc in (
        OSError(errno.EIO, "I/O error"),
        OperationalError("SELECT", {}, sqlite3.OperationalError("database is locked")),
        ValueError("no"),
    ):
        assert as_storage_full(exc) is None, exc
