"""The chunk hot path's read: one statement, one driver call, on a connection kept for it.

Every chunk needs the caller's upload, its target's owner and deleted mark (the rights
re-check) and the row stored for its index, if any. Through a session that was ~9 thread
hand-offs on aiosqlite (BEGIN, cursor, execute, fetch, close, ROLLBACK) or a pool checkout
with its pre-ping round trip on PostgreSQL, plus the ORM's identity-map work, all on the
event loop. Here it is one Core statement compiled once, run straight on the driver of a
connection this reader keeps checked out (`services.common.driver_sql`): one hand-off (SQLite) or
one round trip (PostgreSQL) per chunk.

Consistency: the statement runs outside any explicit transaction (SQLite autocommit,
PostgreSQL AUTOCOMMIT), so it reads one snapshot, like the read-only session it replaces;
it never writes (on SQLite it takes no write lock, so parallel senders' reads never queue
behind a commit). A connection the server dropped is replaced and the read (idempotent)
runs once more on a fresh one: no pre-ping round trip per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, bindparam, case, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.common.auth import Identity
from services.common.driver_sql import DriverStatement
from services.upload.models import ChunkRow, FileRow, UploadRow

_UPLOADS: Table = UploadRow.__table__  # type: ignore[assignment]
_FILES: Table = FileRow.__table__  # type: ignore[assignment]
_CHUNKS: Table = ChunkRow.__table__  # type: ignore[assignment]
_UPLOAD_COLUMNS = list(_UPLOADS.columns)
_TARGET = case((_UPLOADS.c.is_new_file, _UPLOADS.c.folder_id), else_=_UPLOADS.c.file_id)
_COLUMNS = [
    *_UPLOAD_COLUMNS,
    _FILES.c.id,
    _FILES.c.owner_user_id,
    _FILES.c.deleted_at,
    _CHUNKS.c.checksum,
    _CHUNKS.c.size,
    _CHUNKS.c.attempts,
]
_STATEMENT = (
    select(*_COLUMNS)
    .select_from(
        _UPLOADS.outerjoin(
            _FILES, and_(_FILES.c.id == _TARGET, _FILES.c.tenant_id == _UPLOADS.c.tenant_id)
        ).outerjoin(
            _CHUNKS,
            and_(
                _CHUNKS.c.upload_id == _UPLOADS.c.id,
                _CHUNKS.c.chunk_index == bindparam("chunk_index"),
            ),
        )
    )
    .where(
        _UPLOADS.c.id == bindparam("upload_id"),
        _UPLOADS.c.tenant_id == bindparam("tenant_id"),
        _UPLOADS.c.owner_user_id == bindparam("user_id"),
    )
)
_N_UPLOAD = len(_UPLOAD_COLUMNS)


@dataclass(frozen=True, slots=True)
class Target:
    """The upload's target file or folder (in the upload's tenant), as the check needs it."""

    id: str
    owner_user_id: str
    deleted_at: datetime | None


@dataclass(frozen=True, slots=True)
class Stored:
    """What is recorded for an index (plain values)."""

    checksum: str
    size: int
    # Sends of this index that reached its row (1: the one that stored it).
    attempts: int


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """The caller's upload (a detached row, never added to a session), its target (None if
    gone from its tenant) and the row stored for the index (None if none)."""

    upload: UploadRow
    target: Target | None
    stored: Stored | None


class ChunkReads:
    """Runs the per-chunk read (module docstring); `close` returns its connection."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        dialect = engine.dialect
        self._statement = DriverStatement(
            _STATEMENT,
            dialect,
            {
                "upload_id": _UPLOADS.c.id,
                "tenant_id": _UPLOADS.c.tenant_id,
                "user_id": _UPLOADS.c.owner_user_id,
                "chunk_index": _CHUNKS.c.chunk_index,
            },
            _COLUMNS,
        )
        self._sqlite = dialect.name == "sqlite"
        self._connection: AsyncConnection | None = None
        self._driver: Any = None
        self._opening = asyncio.Lock()

    async def read(self, identity: Identity, upload_id: str, index: int) -> ChunkRead | None:
        """The caller's upload `upload_id` with its target and chunk `index`'s row; None if
        the caller has no such upload in their tenant."""
        values = {
            "upload_id": upload_id,
            "tenant_id": identity.tenant_id,
            "user_id": identity.user_id,
            "chunk_index": index,
        }
        driver = await self._driver_connection()
        try:
            rows = await self._statement.run(driver, values)
        except Exception as error:
            if not self._lost(driver, error):
                raise
            # The server dropped the connection: once more on a fresh one.
            await self._drop(driver)
            rows = await self._statement.run(await self._driver_connection(), values)
        if not rows:
            return None
        row = rows[0]
        upload = UploadRow(
            **{c.key: v for c, v in zip(_UPLOAD_COLUMNS, row[:_N_UPLOAD], strict=True)}
        )
        target_id, owner, deleted_at, checksum, size, attempts = row[_N_UPLOAD:]
        target = None if target_id is None else Target(target_id, owner, deleted_at)
        stored = None if checksum is None else Stored(checksum, size, attempts)
        return ChunkRead(upload, target, stored)

    async def close(self) -> None:
        """Return the kept connection to the pool (service shutdown)."""
        async with self._opening:  # one being opened is returned too
            connection, self._connection, self._driver = self._connection, None, None
        if connection is not None:
            await connection.close()

    async def _driver_connection(self) -> Any:
        if self._driver is not None:
            return self._driver
        async with self._opening:
            if self._driver is None:
                connection = await self._engine.connect()
                try:
                    if not self._sqlite:
                        # SQLite's connections are in autocommit already (db.py); the pool
                        # restores PostgreSQL's isolation when the connection goes back.
                        await connection.execution_options(isolation_level="AUTOCOMMIT")
                    raw = await connection.get_raw_connection()
                except BaseException:
                    await connection.close()
                    raise
                self._connection, self._driver = connection, raw.driver_connection
            return self._driver

    def _lost(self, driver: Any, error: Exception) -> bool:
        # A local SQLite file is never "dropped"; a PostgreSQL connection is broken or closed.
        return not self._sqlite and bool(
            getattr(driver, "broken", False) or getattr(driver, "closed", False)
        )

    async def _drop(self, driver: Any) -> None:
        if self._driver is not driver or self._connection is None:
            return  # another read replaced it already
        connection, self._connection, self._driver = self._connection, None, None
        with contextlib.suppress(Exception):  # it is broken: nothing to save
            await connection.invalidate()
            await connection.close()
