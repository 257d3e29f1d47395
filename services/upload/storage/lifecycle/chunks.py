"""Deleting a completed upload's chunks: the `upload.purge_chunks` job.

`commit_content` enqueues it in the transaction that moves the upload `merging ->
completed`: the job exists only once COMPLETED is committed, and a merge that is retried
(the upload still `merging`) can never lose its chunks to it. The handler re-reads the
upload and purges only a COMPLETED one: the chunk blobs, then `chunks_purged_at` (a crash
between them: the job's retry finishes). The chunk rows stay (a few bytes each): a client
retrying a PutChunk after the merge is still answered from them (duplicate, or
CHUNK_CONFLICT for other bytes), never with bytes written again, and the audit's counts
still hold.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.jobs import Handler, JobContext, NewJob, enqueue
from services.common.logging import get_logger
from services.upload import metrics
from services.upload.models import COMPLETED, ChunkRow, UploadRow, utcnow
from services.upload.storage.blob_store import BlobStore, upload_prefix
from services.upload.storage.lifecycle.steps import Doomed, Mark, ReclaimResult, reclaim_step

log = get_logger(__name__)

PURGE_CHUNKS_JOB = "upload.purge_chunks"


async def enqueue_chunk_purge(session: AsyncSession, upload_id: str) -> None:
    """Enqueue the purge of `upload_id`'s chunks in the caller's (COMPLETED) transaction."""
    await enqueue(
        session,
        NewJob(
            job_type=PURGE_CHUNKS_JOB,
            payload={"upload_id": upload_id},
            partition_key=f"purge:{upload_id}",
            idempotency_key=f"purge-chunks:{upload_id}",
        ),
    )


async def purge_completed_chunks(
    sessions: async_sessionmaker[AsyncSession], blobs: BlobStore, upload_id: str
) -> int:
    """Delete a COMPLETED upload's chunk blobs (rows kept); returns the bytes reclaimed."""
    async with sessions() as session:
        upload = await session.get(UploadRow, upload_id)
        if upload is None or upload.status != COMPLETED or upload.chunks_purged_at is not None:
            return 0
        size = int(
            await session.scalar(
                select(func.coalesce(func.sum(ChunkRow.size), 0)).where(
                    ChunkRow.upload_id == upload_id
                )
            )
            or 0
        )
    result = ReclaimResult()
    files = await reclaim_step(
        blobs,
        result,
        [Doomed("completed_chunks", size, prefix=upload_prefix(upload_id))],
        "chunks_purged",
        Mark(sessions, upload_id, ("chunks_purged_at",), utcnow(), COMPLETED),
        upload_id=upload_id,
    )
    metrics.PURGED_CHUNKS.inc(files)
    return size


def purge_chunks_handler(blobs: BlobStore) -> Handler:
    """The `upload.purge_chunks` handler (short transactions of its own)."""

    async def handle(ctx: JobContext) -> None:
        sessions = ctx.sessions
        if sessions is None:
            raise RuntimeError("the job runtime gives handlers a session factory")
        upload_id = str(ctx.payload["upload_id"])
        ctx.effect = {"bytes": await purge_completed_chunks(sessions, blobs, upload_id)}

    return handle
