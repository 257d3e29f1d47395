"""The periodic `upload.reclaim` job: failed uploads, superseded versions, retired files and
orphans.

Each run, in short transactions of its own (deleting blobs before the rows that name them,
so a crash leaves at worst a row whose bytes are gone for something never read again):

1. Failed uploads older than `failed_grace_seconds`: their chunk blobs (the rows stay, as
   for completed uploads: `chunks.py`) and any
   merge output that was written but never committed (`files/{file_id}/{upload_id}`; a
   failed upload's output is never a file's `blob_key`, checked all the same).
2. Completed uploads whose chunks are still there past the orphan grace (the
   `upload.purge_chunks` job normally took them at commit; this is its backstop for
   uploads completed before it existed, or whose job was dead-lettered).
3. Versions: a file's earlier content (the merged blob of a completed upload that is no
   longer the file's `blob_key`) is deleted once it is outside the newest `keep_count`
   versions AND older than `keep_days` (0 days: by count alone). The file's current
   content is never touched. A download that resolved an older version just before it was
   deleted either finishes (an open local file outlives its unlink; an S3 GET in flight
   streams its object) or ends ABORTED/CONTENT_REPLACED — never with other bytes.
4. Retired files (the sync purge deleted the file row, `services/upload/files/retire.py`,
   or the trash purge did, `services/upload/files/trash.py`): all
   their versions' content and any chunks left, at once (nothing can read them again).
5. Orphans: blobs under `uploads/` and `files/` that no row refers to, and temp files
   (a SIGKILLed merge's `*.merge-tmp`, a killed chunk write's `.tmp`), once older than
   their grace (`orphan_grace_seconds`; temp files `temp_grace_seconds`, longer than any
   live write: merge_core writes its temp file continuously and renames it when done).
6. The rows of uploads whose file is gone (purged from the trash or retired) and whose
   blobs steps 1-4 deleted (`retired_rows.py`).
7. Unfinished S3 multipart uploads (a SIGKILLed merge's, recorded in
   `s3_multipart_uploads`, or listed where the server lists them) started more than
   `temp_grace_seconds` ago: aborted, their parts deleted (`BlobStore.abort_unfinished`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.jobs import Handler, JobContext, PeriodicSchedule
from services.common.logging import get_logger
from services.upload.errors import BlobStoreUnavailable
from services.upload.models import COMPLETED, FAILED, MERGING, ChunkRow, FileRow, UploadRow, utcnow
from services.upload.storage.blob_store import BlobStore, StoredObject, content_key, upload_prefix
from services.upload.storage.lifecycle.chunks import purge_completed_chunks
from services.upload.storage.lifecycle.retired_rows import forget_retired_uploads
from services.upload.storage.lifecycle.steps import Doomed, Mark, ReclaimResult, reclaim_step

log = get_logger(__name__)

RECLAIM_JOB = "upload.reclaim"
BATCH = 200
LOOKUP_BATCH = 500


@dataclass(frozen=True)
class ReclaimPolicy:
    """Grace periods and the version retention policy (from UploadSettings)."""

    failed_grace_seconds: float = 24 * 3600
    version_keep_count: int = 2
    version_keep_days: float = 7.0
    orphan_grace_seconds: float = 24 * 3600
    temp_grace_seconds: float = 3600


def reclaim_schedule(interval_seconds: float) -> PeriodicSchedule:
    """The periodic schedule of the reclaim job."""
    return PeriodicSchedule(RECLAIM_JOB, interval_seconds)


@dataclass(frozen=True)
class _Run:
    """What every step of one run works with."""

    sessions: async_sessionmaker[AsyncSession]
    blobs: BlobStore
    policy: ReclaimPolicy
    result: ReclaimResult
    now: datetime

    def mark(self, upload_id: str, columns: tuple[str, ...], status: str | None = None) -> Mark:
        """Set `columns` of the upload to this run's time once its blobs are gone."""
        return Mark(self.sessions, upload_id, columns, self.now, status)

    async def step(
        self, doomed: list[Doomed], event: str, mark: Mark | None = None, **fields: object
    ) -> None:
        """`reclaim_step` in this run's store, counted in its result."""
        await reclaim_step(self.blobs, self.result, doomed, event, mark, **fields)

    async def delete_object(self, item: StoredObject, kind: str, event: str) -> None:
        """Delete one listed object no row needs, counted as `kind`."""
        await self.step([Doomed(kind, item.size, key=item.key)], event, key=item.key)


async def _size(blobs: BlobStore, key: str) -> int | None:
    try:
        return await blobs.size(key)
    except FileNotFoundError:
        return None


async def _reclaim_failed(run: _Run) -> None:
    """Step 1: chunks and uncommitted merge output of failed uploads past the grace."""
    cutoff = run.now - timedelta(seconds=run.policy.failed_grace_seconds)
    async with run.sessions() as session:
        rows = (
            await session.execute(
                select(UploadRow.id, UploadRow.file_id)
                .where(
                    UploadRow.status == FAILED,
                    UploadRow.updated_at < cutoff,
                    (UploadRow.chunks_purged_at.is_(None))
                    | (UploadRow.content_purged_at.is_(None)),
                )
                .limit(BATCH)
            )
        ).all()
        current = set(
            (
                await session.execute(
                    select(FileRow.blob_key).where(FileRow.id.in_({r.file_id for r in rows}))
                )
            ).scalars()
        )
        sizes = dict(
            (
                await session.execute(
                    select(ChunkRow.upload_id, func.sum(ChunkRow.size))
                    .where(ChunkRow.upload_id.in_([r.id for r in rows]))
                    .group_by(ChunkRow.upload_id)
                )
            ).all()
        )
    for row in rows:
        doomed = [
            Doomed("failed_chunks", int(sizes.get(row.id) or 0), prefix=upload_prefix(row.id))
        ]
        key = content_key(row.file_id, row.id)
        if key not in current and (size := await _size(run.blobs, key)) is not None:
            doomed.append(Doomed("failed_output", size, key=key))
        await run.step(
            doomed,
            "failed_upload_reclaimed",
            run.mark(row.id, ("chunks_purged_at", "content_purged_at"), FAILED),
            upload_id=row.id,
            file_id=row.file_id,
        )


async def _reclaim_completed_chunks(run: _Run) -> None:
    """Step 2: the purge job's backstop for completed uploads still holding chunks."""
    cutoff = run.now - timedelta(seconds=run.policy.orphan_grace_seconds)
    async with run.sessions() as session:
        ids = list(
            (
                await session.execute(
                    select(UploadRow.id)
                    .where(
                        UploadRow.status == COMPLETED,
                        UploadRow.chunks_purged_at.is_(None),
                        UploadRow.merge_finished_at < cutoff,
                    )
                    .limit(BATCH)
                )
            ).scalars()
        )
    for upload_id in ids:
        size = await purge_completed_chunks(run.sessions, run.blobs, upload_id)
        run.result.objects += 1 if size else 0


async def _reclaim_versions(run: _Run) -> None:
    """Step 3: superseded versions outside the newest `keep_count` and older than `keep_days`."""
    policy = run.policy
    keep_after = run.now - timedelta(days=policy.version_keep_days)
    async with run.sessions() as session:
        crowded = (
            select(UploadRow.file_id)
            .where(UploadRow.status == COMPLETED, UploadRow.content_purged_at.is_(None))
            .group_by(UploadRow.file_id)
            .having(func.count() > policy.version_keep_count)
            .limit(BATCH)
        )
        rows = (
            await session.execute(
                select(
                    UploadRow.id,
                    UploadRow.file_id,
                    UploadRow.total_size,
                    UploadRow.merge_finished_at,
                    FileRow.blob_key,
                )
                .join(FileRow, FileRow.id == UploadRow.file_id)
                .where(
                    UploadRow.file_id.in_(crowded),
                    UploadRow.status == COMPLETED,
                    UploadRow.content_purged_at.is_(None),
                )
                .order_by(UploadRow.file_id, UploadRow.file_version.desc())
            )
        ).all()
    by_file: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_file[row.file_id].append(row)
    for file_id, versions in by_file.items():
        for rank, row in enumerate(versions):
            key = content_key(file_id, row.id)
            if key == row.blob_key or rank < policy.version_keep_count:
                continue
            if row.merge_finished_at is not None and row.merge_finished_at > keep_after:
                continue
            await run.step(
                [Doomed("old_version", int(row.total_size), key=key)],
                "version_reclaimed",
                run.mark(row.id, ("content_purged_at",)),
                file_id=file_id,
                upload_id=row.id,
                rank=rank,
            )


async def _reclaim_retired(run: _Run) -> None:
    """Step 4: every version (and leftover chunks) of files retired by the sync purge.

    `retire_files` deletes the file row and leaves its uploads; a completed upload whose
    file row is gone can never be read again (the file cannot come back), so its bytes
    go at once, with no grace period.
    """
    async with run.sessions() as session:
        rows = (
            await session.execute(
                select(
                    UploadRow.id,
                    UploadRow.file_id,
                    UploadRow.total_size,
                    UploadRow.chunks_purged_at,
                )
                .outerjoin(FileRow, FileRow.id == UploadRow.file_id)
                .where(
                    FileRow.id.is_(None),
                    UploadRow.status == COMPLETED,
                    (UploadRow.content_purged_at.is_(None))
                    | (UploadRow.chunks_purged_at.is_(None)),
                )
                .limit(BATCH)
            )
        ).all()
    for row in rows:
        doomed = [Doomed("retired", int(row.total_size), key=content_key(row.file_id, row.id))]
        if row.chunks_purged_at is None:
            doomed.append(Doomed("retired", 0, prefix=upload_prefix(row.id)))
        await run.step(
            doomed,
            "retired_file_reclaimed",
            run.mark(row.id, ("chunks_purged_at", "content_purged_at"), COMPLETED),
            upload_id=row.id,
            file_id=row.file_id,
        )


def _chunks(items: list[StoredObject], size: int) -> Iterable[list[StoredObject]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def _live_keys(session: AsyncSession, keys: list[str]) -> set[str]:
    """The keys among `keys` that a row still needs."""
    chunk_keys = [k for k in keys if k.startswith("uploads/")]
    file_keys = [k for k in keys if k.startswith("files/")]
    live: set[str] = set()
    if chunk_keys:
        # A chunk row of an upload whose chunks were purged keeps no blob alive (a racing
        # duplicate write can land one again after the purge).
        live.update(
            (
                await session.execute(
                    select(ChunkRow.blob_key)
                    .join(UploadRow, UploadRow.id == ChunkRow.upload_id)
                    .where(ChunkRow.blob_key.in_(chunk_keys), UploadRow.chunks_purged_at.is_(None))
                )
            ).scalars()
        )
    if file_keys:
        current = await session.execute(
            select(FileRow.blob_key).where(FileRow.blob_key.in_(file_keys))
        )
        live.update(k for k in current.scalars() if k is not None)
        named = {k.split("/")[2]: k for k in file_keys if k.count("/") == 2}
        kept = await session.execute(
            select(UploadRow.id, UploadRow.status, UploadRow.content_purged_at, FileRow.id)
            .outerjoin(FileRow, FileRow.id == UploadRow.file_id)
            .where(UploadRow.id.in_(list(named)))
        )
        for upload_id, status, purged, file_id in kept.all():
            # A merge in progress, or a version the retention policy still keeps.
            if status == MERGING or (status == COMPLETED and purged is None and file_id):
                live.add(named[upload_id])
    return live


async def _listing(blobs: BlobStore, prefix: str, attempts: int = 3) -> list[StoredObject]:
    """The objects under `prefix`; a listing that fails (an object deleted mid-walk can
    fail some S3-compatible servers' listings) is tried again, then left to the next run."""
    for attempt in range(1, attempts + 1):
        try:
            return [item async for item in blobs.list_objects(prefix)]
        except BlobStoreUnavailable:
            if attempt == attempts:
                log.warning("orphan_sweep_skipped", prefix=prefix)
    return []


async def _reclaim_orphans(run: _Run) -> None:
    """Step 5: blobs no row refers to, and abandoned temp files, past their grace."""
    orphan_cutoff = run.now - timedelta(seconds=run.policy.orphan_grace_seconds)
    temp_cutoff = run.now - timedelta(seconds=run.policy.temp_grace_seconds)
    for prefix in ("uploads", "files"):
        candidates: list[StoredObject] = []
        for item in await _listing(run.blobs, prefix):
            if item.temporary:
                if item.modified < temp_cutoff:
                    await run.delete_object(item, "temp", "temp_file_reclaimed")
            elif item.modified < orphan_cutoff:
                candidates.append(item)
        for batch in _chunks(candidates, LOOKUP_BATCH):
            async with run.sessions() as session:
                live = await _live_keys(session, [i.key for i in batch])
            for item in batch:
                if item.key not in live:
                    await run.delete_object(item, "orphan", "orphan_reclaimed")


async def _reclaim_multipart(run: _Run) -> None:
    """Step 6: multipart uploads a killed merge left, past the temp grace."""
    cutoff = run.now - timedelta(seconds=run.policy.temp_grace_seconds)
    try:
        run.result.objects += await run.blobs.abort_unfinished(cutoff)
    except BlobStoreUnavailable:
        log.warning("multipart_sweep_skipped")  # the records stay for the next run


async def reclaim(
    sessions: async_sessionmaker[AsyncSession],
    blobs: BlobStore,
    policy: ReclaimPolicy,
    now: datetime | None = None,
) -> ReclaimResult:
    """One run of every step (module docstring)."""
    result = ReclaimResult()
    run = _Run(sessions, blobs, policy, result, now or utcnow())
    for step in (
        _reclaim_failed,
        _reclaim_completed_chunks,
        _reclaim_versions,
        _reclaim_retired,
        _reclaim_orphans,
        _reclaim_multipart,
    ):
        await step(run)
    await forget_retired_uploads(sessions)
    log.info("storage_reclaimed", objects=result.objects, **dict(result.bytes))
    return result


def reclaim_handler(blobs: BlobStore, policy: ReclaimPolicy) -> Handler:
    """The `upload.reclaim` handler."""

    async def handle(ctx: JobContext) -> None:
        sessions = ctx.sessions
        if sessions is None:
            raise RuntimeError("the job runtime gives handlers a session factory")
        result = await reclaim(sessions, blobs, policy)
        ctx.effect = {"objects": result.objects, **dict(result.bytes)}

    return handle
