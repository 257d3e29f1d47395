"""The upload store's audit: what would show a broken invariant, read-only.

- Duplicate `(upload_id, chunk_index)` rows (invariant 1; the unique constraint should
  make this impossible, which is why it is worth checking).
- Uploads whose distinct stored indexes disagree with `received_chunk_count`
  (invariant 2), or, once past `uploading`, with `total_chunks` (invariant 3 merges only
  full sets). Expired and aborted uploads are left out: cleanup deletes their chunks; so
  are completed uploads without any chunk row, stored whole (UploadFile, RestoreVersion).
- Uploads still `uploading`, with the index ranges they lack.
- A random sample of live completed files re-hashed from their blobs with
  `merge_core.checksum_file` and compared with the recorded checksum.
"""

from __future__ import annotations

from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import merge_core
from services.common.logging import get_logger
from services.upload import metrics
from services.upload.convert import STATUS
from services.upload.errors import BlobStoreUnavailable
from services.upload.models import (
    ABORTED,
    COMPLETED,
    EXPIRED,
    FILE,
    MERGING,
    UPLOADING,
    ChunkRow,
    FileRow,
    UploadRow,
)
from services.upload.ranges import missing_ranges
from services.upload.storage.blob_store import BlobStore

log = get_logger(__name__)

DEFAULT_LIMIT = 100


class UploadAudit:
    """Runs the audit against one database and blob store."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        blobs: BlobStore,
        *,
        default_sample: int,
    ) -> None:
        self._sessions = sessions
        self._blobs = blobs
        self._default_sample = default_sample

    async def run(self, sample_size: int = 0, limit: int = 0) -> upload_pb2.AuditUploadsResponse:
        """The whole audit; `sample_size` / `limit` of 0 take the defaults."""
        sample = sample_size or self._default_sample
        limit = limit or DEFAULT_LIMIT
        resp = upload_pb2.AuditUploadsResponse()
        async with self._sessions() as session:
            resp.duplicate_chunks.extend(await _duplicates(session, limit))
            resp.count_mismatches.extend(await _count_mismatches(session, limit))
            resp.missing_chunks.extend(await _missing(session, limit))
            merging = await session.scalar(
                select(func.count()).select_from(UploadRow).where(UploadRow.status == MERGING)
            )
            files = list(
                (
                    await session.execute(
                        select(
                            FileRow.id,
                            FileRow.blob_key,
                            FileRow.checksum_algorithm,
                            FileRow.checksum,
                        )
                        .where(
                            FileRow.kind == FILE,
                            FileRow.blob_key.is_not(None),
                            FileRow.deleted_at.is_(None),
                        )
                        # random() exists on SQLite and PostgreSQL alike.
                        .order_by(func.random())
                        .limit(sample)
                    )
                ).all()
            )
        metrics.UPLOADS_MERGING.set(merging or 0)
        for f in files:
            resp.checksum_checks.append(
                await self._recheck(f.id, f.blob_key, f.checksum_algorithm, f.checksum)
            )
        resp.healthy = not (
            resp.duplicate_chunks
            or resp.count_mismatches
            or any(not c.ok for c in resp.checksum_checks)
        )
        log.info(
            "upload_audit_finished",
            healthy=resp.healthy,
            duplicates=len(resp.duplicate_chunks),
            count_mismatches=len(resp.count_mismatches),
            sampled=len(resp.checksum_checks),
        )
        return resp

    async def _recheck(
        self, file_id: str, blob_key: str, algorithm: str, recorded: str
    ) -> upload_pb2.ChecksumCheck:
        check = upload_pb2.ChecksumCheck(
            file_id=file_id, blob_key=blob_key, algorithm=algorithm, recorded_checksum=recorded
        )
        try:
            # Hashing releases the GIL and runs off the event loop in every store.
            actual = await self._blobs.checksum(blob_key, algorithm or "sha256")
        except (OSError, merge_core.MergeIOError, BlobStoreUnavailable, ValueError) as exc:
            check.error = f"{type(exc).__name__}: {exc}"
            return check
        check.actual_checksum = actual
        check.ok = actual == recorded
        return check


async def _duplicates(session: AsyncSession, limit: int) -> list[upload_pb2.DuplicateChunkRows]:
    rows = await session.execute(
        select(ChunkRow.upload_id, ChunkRow.chunk_index, func.count().label("n"))
        .group_by(ChunkRow.upload_id, ChunkRow.chunk_index)
        .having(func.count() > 1)
        .order_by(ChunkRow.upload_id, ChunkRow.chunk_index)
        .limit(limit)
    )
    return [
        upload_pb2.DuplicateChunkRows(upload_id=r.upload_id, chunk_index=r.chunk_index, rows=r.n)
        for r in rows
    ]


async def _count_mismatches(
    session: AsyncSession, limit: int
) -> list[upload_pb2.ChunkCountMismatch]:
    stored = (
        select(
            ChunkRow.upload_id,
            func.count(func.distinct(ChunkRow.chunk_index)).label("distinct_chunks"),
        )
        .group_by(ChunkRow.upload_id)
        .subquery()
    )
    distinct = func.coalesce(stored.c.distinct_chunks, 0)
    rows = await session.execute(
        select(UploadRow, distinct.label("distinct_chunks"))
        .outerjoin(stored, stored.c.upload_id == UploadRow.id)
        .where(
            UploadRow.status.not_in((EXPIRED, ABORTED)),
            # Completed without a chunk row: stored whole (UploadFile, RestoreVersion).
            ~((UploadRow.status == COMPLETED) & (distinct == 0)),
            (distinct != UploadRow.received_chunk_count)
            | ((UploadRow.status != UPLOADING) & (distinct != UploadRow.total_chunks)),
        )
        .order_by(UploadRow.id)
        .limit(limit)
    )
    return [
        upload_pb2.ChunkCountMismatch(
            upload_id=u.id,
            status=STATUS[u.status],
            total_chunks=u.total_chunks,
            received_chunk_count=u.received_chunk_count,
            distinct_stored_chunks=n,
        )
        for u, n in rows
    ]


async def _missing(session: AsyncSession, limit: int) -> list[upload_pb2.UploadMissingChunks]:
    uploads = list(
        (
            await session.execute(
                select(UploadRow)
                .where(UploadRow.status == UPLOADING)
                .order_by(UploadRow.created_at, UploadRow.id)
                .limit(limit)
            )
        ).scalars()
    )
    found = []
    for u in uploads:
        indexes = (
            await session.execute(select(ChunkRow.chunk_index).where(ChunkRow.upload_id == u.id))
        ).scalars()
        found.append(
            upload_pb2.UploadMissingChunks(
                upload_id=u.id,
                total_chunks=u.total_chunks,
                received_chunk_count=u.received_chunk_count,
                missing_ranges=[
                    upload_pb2.IndexRange(start=s, end=e)
                    for s, e in missing_ranges(u.total_chunks, indexes)
                ],
            )
        )
    return found
