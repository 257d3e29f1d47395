"""The group commit's two statements, compiled once and run straight on the driver.

Inside the batch's transaction (begun and committed by SQLAlchemy on the same connection)
the multi-row INSERT of chunk rows and each upload's counting UPDATE go to the driver
directly: on aiosqlite one hand-off to its thread each, where SQLAlchemy's cursor takes
four (open, execute, fetch, close); on PostgreSQL no per-statement compile-cache lookup or
result wrapping on the event loop. The statements are SQLAlchemy Core, compiled for the
engine's dialect (the INSERT once per row count), with the columns' own bind and result
processors, so values are stored and read exactly as through SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, Column, Integer, Table, bindparam, case, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from services.upload.models import MERGING, UPLOADING, ChunkRow, UploadRow

_CHUNKS: Table = ChunkRow.__table__  # type: ignore[assignment]
_UPLOADS: Table = UploadRow.__table__  # type: ignore[assignment]
_ROW_KEYS = ("upload_id", "chunk_index", "size", "checksum", "blob_key", "created_at", "attempts")
Processor = Callable[[Any], Any] | None


class _Compiled:
    """One statement compiled for a dialect: its SQL, how to order its parameters, and
    the processors of its bound values (by name) and returned columns."""

    def __init__(
        self, statement: Any, dialect: Dialect, binds: dict[str, Column[Any]], returns: list[Any]
    ) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        # The statement's own literals (e.g. the statuses), bound under generated names.
        self.literals = {k: v for k, v in compiled.params.items() if k not in binds}
        self.names: list[str] | None = (
            list(compiled.positiontup or []) if compiled.positional else None
        )
        self.binds = {
            name: column.type.dialect_impl(dialect).bind_processor(dialect)
            for name, column in binds.items()
        }
        self.results = [
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in returns
        ]

    def params(self, values: dict[str, Any]) -> Any:
        processed = {
            name: value if (p := self.binds.get(name)) is None else p(value)
            for name, value in values.items()
        }
        processed.update(self.literals)
        return processed if self.names is None else [processed[n] for n in self.names]

    def rows(self, raw: Sequence[Sequence[Any]]) -> list[list[Any]]:
        return [
            [v if p is None else p(v) for v, p in zip(row, self.results, strict=True)]
            for row in raw
        ]


class BatchStatements:
    """The INSERT and UPDATE of a group commit for one engine's dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._sqlite = dialect.name == "sqlite"
        self._inserts: dict[int, _Compiled] = {}
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
        self._count = _Compiled(
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
        returned = await self._run(driver, compiled, values)
        return [(r[0], r[1]) for r in compiled.rows(returned)]

    async def count(
        self, driver: Any, upload_id: str, n: int, now: datetime, expires_at: datetime
    ) -> UploadRow | None:
        """Count `n` new chunks on an `uploading` upload (completing it moves it to
        `merging`); the row after it, detached, or None if the upload is not uploading."""
        values = {"n": n, "now": now, "expires_at": expires_at, "upload_id": upload_id}
        returned = self._count.rows(await self._run(driver, self._count, values))
        if not returned:
            return None
        return UploadRow(**dict(zip(self._columns, returned[0], strict=True)))

    def _insert(self, count: int) -> _Compiled:
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
            compiled = _Compiled(
                statement, self._dialect, binds, [_CHUNKS.c.upload_id, _CHUNKS.c.chunk_index]
            )
            self._inserts[count] = compiled
        return compiled

    async def _run(
        self, driver: Any, compiled: _Compiled, values: dict[str, Any]
    ) -> Sequence[Sequence[Any]]:
        params = compiled.params(values)
        if self._sqlite:
            return list(await driver.execute_fetchall(compiled.sql, params))
        cursor = await driver.execute(compiled.sql, params)
        return await cursor.fetchall()
