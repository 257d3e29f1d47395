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
A new chunk is hashed and staged in one worker call (`BlobStore.stage_checked`: on the
local store merge_core writes, hashes and fsyncs in one pass with the GIL released, and
keeps nothing on a checksum mismatch), so the answers are those of hashing first.

Per chunk, the database sees one read: one statement outside any explicit transaction (its
own snapshot) on a connection the reader keeps, run straight on the driver (`chunk_reads`:
one aiosqlite hand-off or one PostgreSQL round trip, no pool checkout or pre-ping) that
returns the upload, its target's owner and deleted mark (the uploader's rights re-check;
only a target the uploader does not own needs the full check) and an existing row; on
SQLite it takes no write lock, so parallel senders' reads never queue behind a commit. The
write is a group commit (`chunk_commits`): every chunk waiting in the process goes into
one transaction of one multi-row INSERT and one UPDATE per upload that counts its chunks
and, for the one that completes the set, moves the upload to `merging` (RETURNING the
row); both statements go to the driver directly (`batch_statements`). A store is two
steps, `prepare` (checks, hash, stage) and `commit` (record, publish), so a stream can
prepare the next chunks while earlier ones commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.common.jobs import ClaimedJob
from services.common.logging import get_logger
from services.upload import checksums, metrics
from services.upload.errors import ChecksumMismatch, ChunkConflict, UploadNotActive
from services.upload.ingest.chunk_commits import Chain, ChunkCommitter, Lost, Recorded
from services.upload.ingest.chunk_reads import Stored
from services.upload.ingest.conflict_repeats import REPEATS
from services.upload.ingest.uploads import (
    MergeClaimer,
    MergeEnqueuer,
    Uploads,
    expected_chunk_size,
    takes_chunks,
)
from services.upload.models import EXPIRED, UPLOADING, ChunkRow, UploadRow
from services.upload.storage.blob_store import BlobStore, chunk_key

log = get_logger(__name__)

# Test-only fault injection (the seed 004 harness): when set, awaited with (upload_id,
# index) after a chunk's bytes are in place and before the upload's count and status are
# updated, inside that transaction. None in every deployment: nothing sets it from
# settings, the environment or a request; only code in the same process (a test) can.
after_chunk_write: Callable[[str, int], Awaitable[None]] | None = None


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What storing one chunk did, and the upload as it stands after it."""

    upload: UploadRow
    index: int
    duplicate: bool
    # True for the one store that moved the upload to `merging`.
    started_merge: bool
    # The merge job leased to this caller (a store given a claimer that started the merge).
    claimed: ClaimedJob | None = None


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
    existing: Stored | None


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
        self._committer = ChunkCommitter(
            sessions,
            blobs,
            enqueue_merge,
            upload_ttl_seconds=upload_ttl_seconds,
            after_write=lambda: after_chunk_write,
        )

    async def put(
        self,
        identity: Identity,
        upload_id: str,
        index: int,
        data: bytes,
        checksum: str,
        *,
        claim: MergeClaimer | None = None,
    ) -> ChunkOutcome:
        """Check and store chunk `index` of `upload_id` (see the module docstring).

        `claim`: if this chunk completes the set, the merge job is enqueued leased to the
        caller (`ChunkOutcome.claimed`), who runs it inline."""
        prepared = await self.prepare(identity, upload_id, index, data, checksum)
        return await self.commit(prepared, claim=claim)

    async def prepare(
        self, identity: Identity, upload_id: str, index: int, data: bytes, checksum: str
    ) -> PreparedChunk:
        """Check chunk `index` and stage its bytes (none if the index is stored already).

        The result must be passed to `commit` or `abandon` (which removes staged bytes)."""
        # Shares may have changed since CreateUpload (the merge checks again).
        found = await self._uploads.read_for_chunk(identity, upload_id, index)
        upload = found.upload
        # The row read answers a retry (fast path below) and numbers this send's attempt.
        existing = found.stored
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
        key = chunk_key(upload.id, index)
        staged: object | None = None
        if existing is None and takes_chunks(upload):
            # A new chunk the upload can take: hashed and staged in one pass on one worker
            # thread; on a mismatch nothing is kept.
            staged, actual = await self._blobs.stage_checked(key, data, algorithm, claimed)
        else:
            # A retry (answered from its row) or an upload that will refuse the chunk (the
            # mismatch still comes first, as it always has): hashed only, nothing written.
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
        try:
            upload = await self._uploads.expire_if_due(upload)
            if upload.status != UPLOADING:
                raise UploadNotActive(
                    f"the upload is {upload.status}",
                    upload_id=upload.id,
                    status=upload.status,
                    reason="UPLOAD_EXPIRED" if upload.status == EXPIRED else None,
                )
            if staged is None:  # defensive: an upload that passed was staged for above
                staged = await self._blobs.stage(key, data)
        except BaseException:
            if staged is not None:
                await asyncio.shield(self._blobs.discard(staged))
            raise
        return PreparedChunk(upload, index, len(data), actual, key, staged, None)

    async def commit(
        self,
        prepared: PreparedChunk,
        chain: Chain | None = None,
        *,
        claim: MergeClaimer | None = None,
    ) -> ChunkOutcome:
        """Record a prepared chunk and publish its bytes (or answer duplicate/conflict).

        The chunk joins the next group commit (`chunk_commits`); `chain`: the stream it
        belongs to, whose later chunks are withdrawn once one of them fails; `claim`: see
        `put`."""
        p = prepared
        if p.existing is not None:
            return await self._answer_existing(p.upload, p.existing, p.index, p.size, p.checksum)
        result = await self._committer.record(
            p.upload, p.index, p.size, p.checksum, p.key, p.staged, chain, claim
        )
        if isinstance(result, Lost):
            return await self._answer_existing(
                p.upload, None, p.index, p.size, p.checksum, seen=result.upload
            )
        return self._stored(p, result)

    async def abandon(self, prepared: PreparedChunk) -> None:
        """Remove a prepared chunk's staged bytes (nothing once they were published)."""
        if prepared.staged is not None:
            await self._blobs.discard(prepared.staged)

    async def close(self) -> None:
        """Stop the group committer (service shutdown)."""
        await self._committer.close()

    async def _answer_existing(
        self,
        upload: UploadRow,
        existing: Stored | None,
        index: int,
        size: int,
        checksum: str,
        *,
        seen: UploadRow | None = None,
    ) -> ChunkOutcome:
        """A send of an index that has a row: duplicate or conflict, its attempt counted.
        `seen`: the upload as the group commit saw it at this chunk (saves a read)."""
        stored = await self._count_attempt(upload.id, index)
        attempt = stored.attempts
        if existing is None:
            existing = stored
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
        if seen is not None:
            return ChunkOutcome(seen, index, duplicate=True, started_merge=False)
        async with self._sessions() as session:
            await read_only(session)
            fresh = await session.get(UploadRow, upload.id)
            assert fresh is not None
        return ChunkOutcome(fresh, index, duplicate=True, started_merge=False)

    async def _count_attempt(self, upload_id: str, index: int) -> Stored:
        """One more send of a stored index (a retry, or other bytes): counted on its row,
        which answers with the total (and what is stored), so concurrent retries each log
        their own number."""
        async with self._sessions.begin() as session:
            counted = (
                await session.execute(
                    update(ChunkRow)
                    .where(ChunkRow.upload_id == upload_id, ChunkRow.chunk_index == index)
                    .values(attempts=ChunkRow.attempts + 1)
                    .returning(ChunkRow.checksum, ChunkRow.size, ChunkRow.attempts)
                )
            ).first()
        assert counted is not None, "a stored chunk's row is never deleted while uploading"
        return Stored(counted.checksum, counted.size, counted.attempts)

    def _stored(self, p: PreparedChunk, result: Recorded) -> ChunkOutcome:
        """Log and count a chunk the group commit inserted."""
        fresh, started = result.upload, result.started_merge
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
                max((fresh.merge_started_at - p.upload.created_at).total_seconds(), 0.0)
                if fresh.merge_started_at is not None
                else 0.0
            )
        return ChunkOutcome(
            fresh, p.index, duplicate=False, started_merge=started, claimed=result.claimed
        )
