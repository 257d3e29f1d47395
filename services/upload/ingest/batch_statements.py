"""The group commit's two statements, compiled once and run straight on the driver.

Inside the batch's transaction (begun and committed by SQLAlchemy on the same connection)
the multi-row INSERT of chunk rows and each upload's counting UPDATE go to the driver
directly: on aiosqlite one hand-off to its thread each, where SQLAlchemy's cursor takes
four (open, execute, fetch, close); on PostgreSQL no per-statement compile-cache lookup or
result wrapping on the event loop. The statements are SQLAlchemy Core, compiled for the
engine's dialect (the INSERT once per row count) as `services.common.driver_sql.DriverStatement`s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, Integer, Table, bindparam, case, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from services.common.driver_sql import DriverStatement
from services.common.session_rows import new_object
from services.upload.models import MERGING, UPLOADING, ChunkRow, UploadRow

_CHUNKS: Table = ChunkRow.__table__  # type: ignore[assignment]
_UPLOADS: Table = UploadRow.__table__  # type: ignore[assignment]
_ROW_KEYS = ("upload_id", "chunk_index", "size", "checksum", "blob_key", "created_at", "attempts")


class BatchStatements:
    """The INSERT and UPDATE of a group commit for one engine's dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._inserts: dict[int, DriverStatement] = {}
        u = _UPLOADS.c
        n: BindParameter[int] = bindparam("n", type_=Integer)
        completes = u.received_chunk_count + n == u.total_chunks
        # SET expressions all read the row as it was before (invariants 2 and 3).
        statement = (
            update(_UPLOADS)
            .where(u.id == bindparam("upload_id"), u.status == UPLOADING)
            .values(
                received_chunk_count=u.received_chunk_count + n,
                updated_at=bindparam("now"),
                expires_at=bindparam("expires_at"),
                status=case((completes, MERGING), else_=u.status),
                merge_started_at=case((completes, bindparam("now")), else_=u.merge_started_at),
            )
            .returning(*_UPLOADS.columns)
        )
        self._count = DriverStatement(
            statement,
            dialect,
            {
                "n": u.received_chunk_count,
                "now": u.updated_at,
                "expires_at": u.expires_at,
                "upload_id": u.id,
            },
            list(_UPLOADS.columns),
        )
        self._columns = [c.key for c in _UPLOADS.columns]

    @staticmethod
    async def driver(connection: AsyncConnection) -> Any:
        """The driver connection under `connection` (its transaction begun by SQLAlchemy):
        the same connection and transaction the statements below run in."""
        return (await connection.get_raw_connection()).driver_connection

    async def insert_chunks(self, driver: Any, rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
        """`INSERT ... ON CONFLICT DO NOTHING RETURNING (upload_id, chunk_index)` of `rows`
        (dicts of chunk row values, in the order given); the keys inserted."""
        compiled = self._insert(len(rows))
        values = {f"{key}_{i}": row[key] for i, row in enumerate(rows) for key in _ROW_KEYS}
        return [(r[0], r[1]) for r in await compiled.run(driver, values)]

    async def count(
        self, driver: Any, upload_id: str, n: int, now: datetime, expires_at: datetime
    ) -> UploadRow | None:
        """Count `n` new chunks on an `uploading` upload (completing it moves it to
        `merging`); the row after it, detached, or None if the upload is not uploading."""
        values = {"n": n, "now": now, "expires_at": expires_at, "upload_id": upload_id}
        returned = await self._count.run(driver, values)
        if not returned:
            return None
        return new_object(UploadRow, dict(zip(self._columns, returned[0], strict=True)))

    def _insert(self, count: int) -> DriverStatement:
        compiled = self._inserts.get(count)
        if compiled is None:
            make = postgresql.insert if self._dialect.name == "postgresql" else sqlite.insert
            statement = (
                make(_CHUNKS)
                .values([{key: bindparam(f"{key}_{i}") for key in _ROW_KEYS} for i in range(count)])
                .on_conflict_do_nothing(index_elements=["upload_id", "chunk_index"])
                # RETURNING, not rowcount: psycopg reports -1 for ON CONFLICT inserts.
                .returning(_CHUNKS.c.upload_id, _CHUNKS.c.chunk_index)
            )
            binds = {f"{key}_{i}": _CHUNKS.c[key] for i in range(count) for key in _ROW_KEYS}
            compiled = DriverStatement(
                statement, self._dialect, binds, [_CHUNKS.c.upload_id, _CHUNKS.c.chunk_index]
            )
            self._inserts[count] = compiled
        return compiled
