"""Storing one chunk: checked, written durably, recorded exactly once.

Invariant 1: `(upload_id, chunk_index)` is unique. A retry with the same checksum is a
success with `duplicate=True` and no new effect; another checksum or size is
CHUNK_CONFLICT and the stored chunk is untouched.
Invariant 2: `received_chunk_count` grows only when the row is inserted, in the same
transaction as the insert.
Invariant 3: the store that completes the set wins `uploading -> merging` and enqueues the
merge job in that same transaction.

Why the bytes are renamed into place *inside* the transaction, after the insert: the
inserter of the row is the only writer of `uploads/{id}/{index}`. The bytes are staged
(temp file + fsync) before the transaction; once `INSERT ... ON CONFLICT DO NOTHING` has
inserted our row (PostgreSQL holds the unique key until commit; SQLite holds the write
lock), nobody else can have a committed row for that index, so the rename may replace
only an orphan from a crashed attempt. A loser of the insert discards its staged bytes.

Blob writes (write + fsync of up to 32 MiB, rename + directory fsync) and hashing run on
worker threads (`asyncio.to_thread`; hashing releases the GIL): on the event loop they
would stall every other RPC and the job runtime's heartbeats for the length of an fsync.

Per chunk, the database sees one read-only snapshot (the upload, the uploader's rights, an
existing row; on SQLite it takes no write lock, so parallel senders' reads never queue
behind a commit) and one write transaction of two statements: the INSERT, and one UPDATE
that counts the chunk and, for the one that completes the set, moves the upload to
`merging` (RETURNING the row). A store is two steps, `prepare` (checks, hash, stage) and
`commit` (record, publish), so a stream can prepare the next chunk while one commits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.common.logging import get_logger
from services.upload import checksums, metrics
from services.upload.blob_store import BlobStore, chunk_key
from services.upload.conflict_repeats import REPEATS
from services.upload.errors import ChecksumMismatch, ChunkConflict, UploadNotActive
from services.upload.models import EXPIRED, MERGING, UPLOADING, ChunkRow, UploadRow, utcnow
from services.upload.uploads import (
    MergeEnqueuer,
    Uploads,
    check_uploader,
    expected_chunk_size,
)

log = get_logger(__name__)

# Test-only fault injection (the seed 004 harness): when set, awaited with (upload_id,
# index) after a chunk's bytes are in place and before the upload's count and status are
# updated, inside that transaction. None in every deployment: nothing sets it from
# settings, the environment or a request; only code in the same process (a test) can.
after_chunk_write: Callable[[str, int], Awaitable[None]] | None = None
_NO_LOCK = contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What storing one chunk did, and the upload as it stands after it."""

    upload: UploadRow
    index: int
    duplicate: bool
    # True for the one store that moved the upload to `merging`.
    started_merge: bool


@dataclass(frozen=True, slots=True)
class _Stored:
    """What is recorded for an index (plain values: they outlive the session)."""

    checksum: str
    size: int
    # Sends of this index that reached its row (1: the one that stored it).
    attempts: int


@dataclass(frozen=True, slots=True)
class PreparedChunk:
    """A checked chunk whose bytes are staged, ready for `ChunkStore.commit`."""

    upload: UploadRow
    index: int
    size: int
    checksum: str
    key: str
    # The blob store's staging handle; None when the index was stored already.
    staged: object | None
    # The row found for the index when it was checked (a retry: nothing staged).
    existing: _Stored | None


class _AlreadyStored(Exception):
    """The index had a row when our insert ran (internal control flow)."""

    def __init__(self, existing: _Stored) -> None:
        self.existing = existing


class ChunkStore:
    """Stores chunks of the caller's uploads."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        uploads: Uploads,
        blobs: BlobStore,
        enqueue_merge: MergeEnqueuer,
        *,
        upload_ttl_seconds: float,
    ) -> None:
        self._sessions = sessions
        self._uploads = uploads
        self._blobs = blobs
        self._enqueue_merge = enqueue_merge
        self._ttl = upload_ttl_seconds
        self._sqlite_writes = asyncio.Lock()

    async def put(
        self, identity: Identity, upload_id: str, index: int, data: bytes, checksum: str
    ) -> ChunkOutcome:
        """Check and store chunk `index` of `upload_id` (see the module docstring)."""
        return await self.commit(await self.prepare(identity, upload_id, index, data, checksum))

    async def prepare(
        self, identity: Identity, upload_id: str, index: int, data: bytes, checksum: str
    ) -> PreparedChunk:
        """Check chunk `index` and stage its bytes (none if the index is stored already).

        The result must be passed to `commit` or `abandon` (which removes staged bytes)."""
        async with self._sessions() as session:
            await read_only(session)
            upload, target, row = await self._uploads.load_for_chunk(
                session, identity, upload_id, index
            )
            # Shares may have changed since CreateUpload (the merge checks again). A missing
            # target is looked up again by the full check, which names the error.
            await check_uploader(session, upload, target=target)
        # The row read answers a retry (fast path below) and numbers this send's attempt.
        existing = None if row is None else _Stored(row.checksum, row.size, row.attempts)
        attempt = 1 if existing is None else existing.attempts + 1
        if not 0 <= index < upload.total_chunks:
            raise InvalidArgument(
                "chunk_index",
                f"must be 0..{upload.total_chunks - 1}",
                reason="CHUNK_INDEX_OUT_OF_RANGE",
            )
        chunk_log = log.bind(
            upload_id=upload.id,
            chunk_index=index,
            total_chunks=upload.total_chunks,
            checksum=checksum,
            size=len(data),
            attempt=attempt,
        )
        chunk_log.info("chunk_received")
        want_size = expected_chunk_size(upload, index)
        if len(data) != want_size:
            raise InvalidArgument(
                "data",
                f"chunk {index} must be {want_size} bytes, got {len(data)}",
                reason="CHUNK_SIZE_MISMATCH",
            )
        algorithm = upload.checksum_algorithm
        claimed = checksums.normalize_hex(checksum, algorithm, "checksum")
        actual = await checksums.digest_async(data, algorithm)
        if actual != claimed:
            raise ChecksumMismatch(
                "checksum",
                f"chunk {index} hashes to {actual}, not {claimed}",
                expected=claimed,
                actual=actual,
                chunk_index=index,
            )
        chunk_log.info("chunk_validated")
        # Fast path for retries: an existing row answers without touching the disk.
        if existing is not None:
            return PreparedChunk(upload, index, len(data), actual, "", None, existing)
        upload = await self._uploads.expire_if_due(upload)
        if upload.status != UPLOADING:
            raise UploadNotActive(
                f"the upload is {upload.status}",
                upload_id=upload.id,
                status=upload.status,
                reason="UPLOAD_EXPIRED" if upload.status == EXPIRED else None,
            )
        key = chunk_key(upload.id, index)
        staged = await self._blobs.stage(key, data)
        return PreparedChunk(upload, index, len(data), actual, key, staged, None)

    async def commit(self, prepared: PreparedChunk) -> ChunkOutcome:
        """Record a prepared chunk and publish its bytes (or answer duplicate/conflict)."""
        p = prepared
        if p.existing is not None:
            return await self._answer_existing(p.upload, p.existing, p.index, p.size, p.checksum)
        published = False
        try:
            outcome = await self._record(p)
            published = True  # renamed into place: no temp file left to remove
            return outcome
        except _AlreadyStored as lost:
            return await self._answer_existing(p.upload, lost.existing, p.index, p.size, p.checksum)
        finally:
            if not published:
                # Shielded: a cancelled call must still remove its temp file.
                await asyncio.shield(self.abandon(p))

    async def abandon(self, prepared: PreparedChunk) -> None:
        """Remove a prepared chunk's staged bytes (nothing once they were published)."""
        if prepared.staged is not None:
            await self._blobs.discard(prepared.staged)

    async def _answer_existing(
        self, upload: UploadRow, existing: _Stored, index: int, size: int, checksum: str
    ) -> ChunkOutcome:
        attempt = await self._count_attempt(upload.id, index)
        if existing.checksum != checksum or existing.size != size:
            metrics.CHUNK_CONFLICTS.inc()
            metrics.CHUNK_CONFLICTS_BY_INDEX.labels(metrics.index_bucket(index)).inc()
            log.info(
                "chunk_conflict",
                upload_id=upload.id,
                chunk_index=index,
                total_chunks=upload.total_chunks,
                checksum=checksum,
                stored_checksum=existing.checksum,
                attempt=attempt,
            )
            REPEATS.record(upload.id, index)
            raise ChunkConflict(
                f"chunk {index} is already stored with another checksum or size",
                upload_id=upload.id,
                chunk_index=index,
                stored_checksum=existing.checksum,
                stored_size=existing.size,
            )
        metrics.CHUNK_DUPLICATES.inc()
        log.info(
            "chunk_duplicate",
            upload_id=upload.id,
            chunk_index=index,
            total_chunks=upload.total_chunks,
            checksum=checksum,
            attempt=attempt,
        )
        async with self._sessions() as session:
            await read_only(session)
            fresh = await session.get(UploadRow, upload.id)
            assert fresh is not None
        return ChunkOutcome(fresh, index, duplicate=True, started_merge=False)

    async def _count_attempt(self, upload_id: str, index: int) -> int:
        """One more send of a stored index (a retry, or other bytes): counted on its row,
        which answers with the total, so concurrent retries each log their own number."""
        async with self._sessions.begin() as session:
            counted = await session.scalar(
                update(ChunkRow)
                .where(ChunkRow.upload_id == upload_id, ChunkRow.chunk_index == index)
                .values(attempts=ChunkRow.attempts + 1)
                .returning(ChunkRow.attempts)
            )
        return int(counted or 0)

    async def _record(self, p: PreparedChunk) -> ChunkOutcome:
        now = utcnow()
        async with self._sessions() as session:
            dialect = session.get_bind().dialect.name
            # SQLite has one writer at a time, and a writer that finds the lock taken sleeps
            # in steps of up to 100 ms: this process's chunk commits queue here instead, in
            # order, each starting the moment the previous one ends.
            async with self._sqlite_writes if dialect == "sqlite" else _NO_LOCK:
                fresh = await self._write(session, dialect, p, now)
        started = fresh.status == MERGING
        metrics.CHUNKS_STORED.inc()
        log.info(
            "chunk_stored",
            upload_id=p.upload.id,
            chunk_index=p.index,
            total_chunks=p.upload.total_chunks,
            checksum=p.checksum,
            size=p.size,
            attempt=1,
        )
        if started:
            metrics.STATUS_SECONDS.labels(UPLOADING).observe(
                max((now - p.upload.created_at).total_seconds(), 0.0)
            )
            log.info(
                "upload_status_changed",
                upload_id=p.upload.id,
                from_status=UPLOADING,
                to_status=MERGING,
                transition=f"{UPLOADING} → {MERGING}",
            )
            log.info("upload_merge_started", upload_id=p.upload.id, file_id=p.upload.file_id)
        return ChunkOutcome(fresh, p.index, duplicate=False, started_merge=started)

    async def _write(
        self, session: AsyncSession, dialect: str, p: PreparedChunk, now: datetime
    ) -> UploadRow:
        """The chunk's transaction: its row, its bytes published, the upload counted."""
        async with session.begin():
            insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
            inserted = await session.execute(
                insert(ChunkRow)
                .values(
                    upload_id=p.upload.id,
                    chunk_index=p.index,
                    size=p.size,
                    checksum=p.checksum,
                    blob_key=p.key,
                    created_at=now,
                )
                .on_conflict_do_nothing(index_elements=["upload_id", "chunk_index"])
                # RETURNING, not rowcount: psycopg reports -1 for ON CONFLICT inserts.
                .returning(ChunkRow.id)
            )
            if inserted.first() is None:
                existing = await _stored(session, p.upload.id, p.index)
                assert existing is not None, "ON CONFLICT found a row"
                raise _AlreadyStored(existing)
            # Our row: we are the only writer of this key (see the module docstring).
            await self._blobs.publish(p.staged, p.key)
            if after_chunk_write is not None:
                await after_chunk_write(p.upload.id, p.index)
            # Count the chunk; the one store that completes the set also moves the upload to
            # merging (invariant 3). SET expressions all read the row as it was before.
            completes = UploadRow.received_chunk_count + 1 == UploadRow.total_chunks
            fresh = (
                await session.execute(
                    update(UploadRow)
                    .where(UploadRow.id == p.upload.id, UploadRow.status == UPLOADING)
                    .values(
                        received_chunk_count=UploadRow.received_chunk_count + 1,
                        updated_at=now,
                        expires_at=now + timedelta(seconds=self._ttl),
                        status=case((completes, MERGING), else_=UploadRow.status),
                        merge_started_at=case((completes, now), else_=UploadRow.merge_started_at),
                    )
                    .returning(UploadRow)
                    .execution_options(synchronize_session=False, populate_existing=True)
                )
            ).scalar_one_or_none()
            if fresh is None:
                # Aborted or expired meanwhile: roll back the row (the bytes are an orphan).
                raise UploadNotActive("the upload stopped accepting chunks", upload_id=p.upload.id)
            if fresh.status == MERGING:
                await self._enqueue_merge(session, fresh)
        return fresh


async def _stored(session: AsyncSession, upload_id: str, index: int) -> _Stored | None:
    row = (
        await session.execute(
            select(ChunkRow.checksum, ChunkRow.size, ChunkRow.attempts).where(
                ChunkRow.upload_id == upload_id, ChunkRow.chunk_index == index
            )
        )
    ).first()
    return None if row is None else _Stored(row.checksum, row.size, row.attempts)
