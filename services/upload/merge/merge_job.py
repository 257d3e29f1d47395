"""The merge job: turn a complete set of chunks into the file's next version, exactly once.

Enqueued (idempotency key `merge:{upload_id}`) by the chunk store in the transaction that
won `uploading -> merging`. The slow parts run before the job's own transaction begins
(on SQLite a begun transaction holds the database's write lock, so chunk uploads to other
uploads would wait behind a merge):

1. In a short read transaction of its own, load the upload and its chunk rows; anything
   but `merging` means the merge already happened (or the job is a redelivery): do
   nothing (invariant 3). The rows must be exactly indexes 0..N-1.
2. The blob store's merge (merge_core, off the event loop) streams the chunks in index
   order into `files/{file_id}/{upload_id}`, verifying every chunk's size and checksum
   and the whole file's, and makes the output visible only once verified: temp + rename
   locally, a multipart upload completed after verification on S3 (invariant 4).
3. Take `file:{file_id}` from the lock service.
4. Only now touch the job's transaction (`ctx.session`): re-check the upload is still
   `merging`, then commit with the fencing check (invariant 7), bumping the version,
   writing `file.content.updated` (invariant 6) and `merging -> completed`; the job's
   completion commits with them. A corrupt chunk ends the upload `failed` instead.

A worker killed mid-merge leaves the upload `merging` and the job leased; the lease ends,
another worker runs the job again from step 1, and the deterministic output key means the
second merge simply replaces the first one's (never published) result.

An attempt that fails for good (a permanent error, or any error on the retry policy's last
attempt) first moves the upload `merging -> failed` with the error as the reason, in a
short transaction of its own (the job's transaction is about to roll back), then re-raises
so the runtime dead-letters the job. A job that dies without running this handler (the
runtime's crash-loop guard) is caught by the sweep in `stuck_merges.py`.
"""

from __future__ import annotations

import time

import serentak.errors
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

import merge_core
from services.common import tracing
from services.common.jobs import (
    ConflictError,
    JobContext,
    NewJob,
    RetryPolicy,
    TransientError,
    enqueue,
)
from services.common.jobs.errors import PERMANENT, error_class_of
from services.common.logging import get_logger
from services.upload import metrics
from services.upload.errors import (
    BlobStoreUnavailable,
    FileDeleted,
    StaleFencingToken,
    UploaderNotAllowed,
)
from services.upload.ingest.finish_waits import FinishSignals
from services.upload.ingest.uploads import check_uploader, transition
from services.upload.merge.file_locks import FileLocks
from services.upload.merge.version_commit import commit_content
from services.upload.models import (
    FAILED,
    MERGING,
    ChunkRow,
    FileRow,
    UploadRow,
    utcnow,
)
from services.upload.storage.blob_store import BlobStore, ChunkRef, Merged, content_key

log = get_logger(__name__)

MERGE_JOB = "upload.merge"
# merge_core's refusals, as the reason label of serentak_upload_merge_failures_total.
_FAILURE_REASONS = {
    merge_core.ChunkChecksumMismatch: "checksum",
    merge_core.FileChecksumMismatch: "checksum",
    merge_core.ChunkSizeMismatch: "size",
    merge_core.MissingChunk: "missing_chunk",
    merge_core.DuplicateChunk: "duplicate_chunk",
}


def merge_job(upload: UploadRow) -> NewJob:
    """The merge job for `upload`; per-file partition so one file's merges run in order."""
    return NewJob(
        job_type=MERGE_JOB,
        payload={"upload_id": upload.id},
        partition_key=f"file:{upload.file_id}",
        idempotency_key=f"merge:{upload.id}",
    )


async def enqueue_merge(session: AsyncSession, upload: UploadRow) -> None:
    """Enqueue the merge of `upload` in the caller's transaction (the one that won merging)."""
    await enqueue(session, merge_job(upload))


class MergeFailed(Exception):
    """The chunks cannot make the file (corrupt, missing, wrong size): the upload fails."""


class MergeRefused(MergeFailed):
    """At commit the uploader may no longer write the file, or it is deleted: the upload
    fails with the refusal's reason (UPLOADER_NOT_ALLOWED, FILE_DELETED) and nothing of
    it becomes visible."""


class MergeHandler:
    """The `upload.merge` job handler."""

    def __init__(
        self,
        blobs: BlobStore,
        locks: FileLocks,
        *,
        lock_ttl_seconds: int,
        lock_wait_seconds: float,
        retry: RetryPolicy | None = None,
        signals: FinishSignals | None = None,
    ) -> None:
        self._blobs = blobs
        # Wakes the GetUpload calls waiting on an upload once its end is committed.
        self._signals = signals or FinishSignals()
        self._locks = locks
        self._lock_ttl = lock_ttl_seconds
        self._lock_wait = lock_wait_seconds
        # Must be the policy the job type is registered with: it says which attempt is last.
        self._retry = retry or RetryPolicy()

    async def __call__(self, ctx: JobContext) -> None:
        """Run one merge job (see the module docstring)."""
        upload_id = str(ctx.payload["upload_id"])
        try:
            await self._run(ctx, upload_id)
        except Exception as exc:
            if error_class_of(exc) == PERMANENT or self._retry.gives_up_after(ctx.attempt):
                await self._give_up(ctx, upload_id, exc)
            raise

    async def _run(self, ctx: JobContext, upload_id: str) -> None:
        # Step 1 reads in a transaction of its own; without a factory (an old runtime)
        # the job's transaction is the only one there is.
        reads = ctx.sessions
        if reads is not None:
            async with reads() as session:
                upload, rows = await _load(session, upload_id)
        else:
            upload, rows = await _load(ctx.session, upload_id)
        if upload is None or upload.status != MERGING:
            metrics.DUPLICATE_MERGES_REFUSED.inc()
            log.info("merge_skipped", upload_id=upload_id, status=upload.status if upload else None)
            ctx.effect = {"skipped": upload.status if upload else "missing"}
            return
        started = time.monotonic()
        try:
            with tracing.span(
                "upload merge",
                upload_id=upload.id,
                file_id=upload.file_id,
                chunks=len(rows),
                bytes=upload.total_size,
            ):
                result = await self._merge(upload, rows)
        except MergeFailed as failure:
            await self._fail(ctx.session, upload, str(failure))
            ctx.effect = {"failed": str(failure)[:500]}
            return
        except (merge_core.MergeIOError, BlobStoreUnavailable) as exc:
            # A disk, file-system or object-store hiccup may pass; the last attempt gives
            # up (__call__).
            raise TransientError(f"merge I/O error: {exc}") from exc
        try:
            file = await self._commit(ctx.session, upload, result)
        except MergeRefused as refused:
            await self._fail(ctx.session, upload, str(refused))
            # The merged bytes were never published; nothing refers to them.
            await self._blobs.delete(content_key(upload.file_id, upload.id))
            ctx.effect = {"failed": str(refused)[:500]}
            return
        if file is None:
            metrics.DUPLICATE_MERGES_REFUSED.inc()
            log.info("merge_skipped_after_merge", upload_id=upload.id)
            ctx.effect = {"skipped": "left merging"}
            return
        self._signals.after_commit(ctx.session, upload.id)
        metrics.MERGES.labels("completed").inc()
        _observe_merging(upload)
        metrics.MERGE_DURATION.observe(time.monotonic() - started)
        log.info(
            "merge_completed",
            upload_id=upload.id,
            file_id=file.id,
            version=file.version,
            size=result.size,
            fencing_token=file.last_lock_token,
        )
        ctx.effect = {"file_id": file.id, "version": file.version}

    async def _merge(self, upload: UploadRow, rows: list[ChunkRow]) -> Merged:
        indexes = [r.chunk_index for r in rows]
        if indexes != list(range(upload.total_chunks)):
            missing = sorted(set(range(upload.total_chunks)) - set(indexes))
            metrics.MERGE_FAILURES.labels("missing_chunk").inc()
            raise MergeFailed(
                f"chunk rows are not 0..{upload.total_chunks - 1}; missing {missing[:10]}"
            )
        chunks = [ChunkRef(r.chunk_index, r.blob_key, r.size, r.checksum) for r in rows]
        try:
            # Every store hashes off the event loop (merge_core releases the GIL), so the
            # job runtime's heartbeats keep going during a long merge.
            return await self._blobs.merge(
                chunks,
                content_key(upload.file_id, upload.id),
                upload.checksum_algorithm,
                upload.expected_checksum or None,
            )
        except (
            merge_core.ChunkChecksumMismatch,
            merge_core.ChunkSizeMismatch,
            merge_core.MissingChunk,
            merge_core.DuplicateChunk,
            merge_core.FileChecksumMismatch,
        ) as exc:
            metrics.MERGE_FAILURES.labels(_FAILURE_REASONS[type(exc)]).inc()
            raise MergeFailed(f"{type(exc).__name__}: {exc}") from exc

    async def _fail(self, session: AsyncSession, upload: UploadRow, reason: str) -> None:
        moved = await transition(
            session,
            upload.id,
            MERGING,
            FAILED,
            failure_reason=reason[:2000],
            merge_finished_at=utcnow(),
        )
        if not moved:
            log.info("merge_failure_not_recorded", upload_id=upload.id, reason=reason)
            return
        self._signals.after_commit(session, upload.id)
        metrics.MERGES.labels("failed").inc()
        _observe_merging(upload)
        log.warning("merge_failed", upload_id=upload.id, file_id=upload.file_id, reason=reason)

    async def _give_up(self, ctx: JobContext, upload_id: str, exc: Exception) -> None:
        """Record `merging -> failed` for an attempt that will not be retried."""
        reason = f"merge gave up on attempt {ctx.attempt}: {type(exc).__name__}: {exc}"
        if ctx.sessions is None:
            log.warning("merge_failure_left_to_sweep", upload_id=upload_id, reason=reason)
            return
        try:
            # The job's transaction rolls back anyway once we re-raise; ending it now frees
            # SQLite's write lock, which our own transaction below needs.
            await ctx.session.rollback()
            async with ctx.sessions.begin() as session:
                moved = await transition(
                    session,
                    upload_id,
                    MERGING,
                    FAILED,
                    failure_reason=reason[:2000],
                    merge_finished_at=utcnow(),
                )
        except Exception:
            # The database is unreachable: the dead-letter sweep records it later.
            log.exception("merge_failure_not_recorded", upload_id=upload_id, reason=reason)
            return
        if moved:
            self._signals.finished(upload_id)
            metrics.MERGES.labels("failed").inc()
            log.warning("merge_failed", upload_id=upload_id, reason=reason)

    async def _commit(
        self, session: AsyncSession, upload: UploadRow, result: Merged
    ) -> FileRow | None:
        """Commit under the file lock; None if the upload left `merging` meanwhile."""
        try:
            async with self._locks.hold(
                f"file:{upload.file_id}",
                tenant_id=upload.tenant_id,
                ttl=self._lock_ttl,
                wait_timeout=self._lock_wait,
            ) as lock:
                # The job's transaction begins here, after the merge and the lock wait.
                status = await session.scalar(
                    select(UploadRow.status).where(UploadRow.id == upload.id)
                )
                if status != MERGING:
                    return None
                # Unshared or deleted since CreateUpload? Checked under the lock, in the
                # transaction that would commit (invariant 7's fencing check follows).
                try:
                    await check_uploader(session, upload)
                except (UploaderNotAllowed, FileDeleted) as exc:
                    raise MergeRefused(f"{exc.reason}: {exc.message}") from exc
                log.info(
                    "merge_lock_acquired",
                    upload_id=upload.id,
                    file_id=upload.file_id,
                    fencing_token=lock.token,
                )
                file = await commit_content(session, upload, result, lock.token)
        except StaleFencingToken as exc:
            # A newer holder committed first (ours was lost): retry under a fresh lock.
            metrics.MERGE_FAILURES.labels("lock").inc()
            raise ConflictError(str(exc)) from exc
        except serentak.errors.SerentakError as exc:  # ours and the lock client's
            metrics.MERGE_FAILURES.labels("lock").inc()
            # LOCK_HELD past the wait, lock service or etcd unavailable: try again later.
            raise TransientError(f"file lock: {exc}") from exc
        return file


def _observe_merging(upload: UploadRow) -> None:
    """Time from the merge's start (the last chunk) to its end, in the status histogram."""
    if upload.merge_started_at is not None:
        elapsed = (utcnow() - upload.merge_started_at).total_seconds()
        metrics.STATUS_SECONDS.labels(MERGING).observe(max(elapsed, 0.0))


async def _load(session: AsyncSession, upload_id: str) -> tuple[UploadRow | None, list[ChunkRow]]:
    """The upload and its chunk rows in index order (no rows unless it is merging)."""
    upload = await session.get(UploadRow, upload_id, populate_existing=True)
    if upload is None or upload.status != MERGING:
        return upload, []
    rows = list(
        (
            await session.execute(
                select(ChunkRow)
                .where(ChunkRow.upload_id == upload.id)
                .order_by(ChunkRow.chunk_index)
            )
        ).scalars()
    )
    return upload, rows
