"""Step 6 of `upload.reclaim`: the rows of uploads whose file is gone for good.

A file purged from the trash (`files/trash.py`) or retired by the sync purge
(`files/retire.py`) leaves its uploads behind; step 4 deletes their bytes and marks them.
Once every blob an upload names is gone, nothing can read it again (its file cannot come
back, a late chunk retry of it can only fail), so its chunk rows and its row are deleted
too, in batches of their own transactions. Uploads that never had a file (a new file's
upload that failed, expired or was aborted) stay: they are what ListUploads shows.
"""

from __future__ import annotations

from sqlalchemy import delete, exists, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.logging import get_logger
from services.upload import metrics
from services.upload.models import (
    ABORTED,
    COMPLETED,
    EXPIRED,
    FAILED,
    ChunkRow,
    FileRow,
    UploadRow,
)

log = get_logger(__name__)

BATCH = 500


def _forgettable() -> object:
    file_gone = ~exists().where(FileRow.id == UploadRow.file_id)
    blobs_gone = UploadRow.chunks_purged_at.is_not(None) & (
        UploadRow.content_purged_at.is_not(None) | UploadRow.status.in_((EXPIRED, ABORTED))
    )
    had_a_file = or_(UploadRow.status == COMPLETED, UploadRow.is_new_file.is_(False))
    return (
        file_gone
        & blobs_gone
        & had_a_file
        & UploadRow.status.in_((COMPLETED, FAILED, EXPIRED, ABORTED))
    )


async def forget_retired_uploads(sessions: async_sessionmaker[AsyncSession]) -> int:
    """Delete the chunk rows and rows of uploads of gone files whose blobs are gone."""
    total = 0
    while True:
        async with sessions.begin() as session:
            ids = list(
                (
                    await session.execute(
                        select(UploadRow.id).where(_forgettable()).limit(BATCH)  # type: ignore[arg-type]
                    )
                ).scalars()
            )
            if ids:
                await _delete(session, ids)
        total += len(ids)
        metrics.UPLOAD_ROWS_FORGOTTEN.inc(len(ids))
        if len(ids) < BATCH:
            if total:
                log.info("retired_uploads_forgotten", uploads=total)
            return total


async def _delete(session: AsyncSession, ids: list[str]) -> None:
    await session.execute(delete(ChunkRow).where(ChunkRow.upload_id.in_(ids)))
    await session.execute(delete(UploadRow).where(UploadRow.id.in_(ids)))
