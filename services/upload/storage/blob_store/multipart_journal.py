"""The durable record of S3 multipart uploads in progress (`s3_multipart_uploads`).

A multipart upload's parts are stored by S3 but are no object: no listing of objects shows
them, and only its upload id can abort them. So the S3 merge records each upload here, in a
transaction of its own committed right after CreateMultipartUpload answers and before any
part is sent, and deletes the row once the upload is completed or aborted. A merge killed
in between leaves the row; the re-run merge of the same key aborts what it names
(`for_key`), and so does the reclaim sweep past a grace period (`older_than`).

The one window left: a kill between CreateMultipartUpload's answer and this row's commit
(a few milliseconds) names nothing here; the sweep's ListMultipartUploads, where the
server has it, is the net for that.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.upload.models import MultipartUploadRow, utcnow


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded multipart upload."""

    key: str
    upload_id: str
    started_at: datetime


class MultipartJournal:
    """Rows of `s3_multipart_uploads`, each write its own committed transaction."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def started(self, key: str, upload_id: str) -> None:
        """Record that `upload_id` (of `key`) exists on S3, before any part is sent."""
        async with self._sessions() as session, session.begin():
            session.add(
                MultipartUploadRow(upload_id=upload_id, object_key=key, started_at=utcnow())
            )

    async def finished(self, upload_id: str) -> None:
        """Forget `upload_id`: completed or aborted (missing is fine)."""
        async with self._sessions() as session, session.begin():
            await session.execute(
                delete(MultipartUploadRow).where(MultipartUploadRow.upload_id == upload_id)
            )

    async def for_key(self, key: str) -> list[Recorded]:
        """The uploads recorded for `key` (a merge's predecessors)."""
        return await self._select(MultipartUploadRow.object_key == key)

    async def older_than(self, cutoff: datetime, limit: int = 500) -> list[Recorded]:
        """Uploads started before `cutoff`, oldest first (the sweep's)."""
        return await self._select(MultipartUploadRow.started_at < cutoff, limit=limit)

    async def _select(self, where: ColumnElement[bool], limit: int | None = None) -> list[Recorded]:
        query = select(MultipartUploadRow).where(where).order_by(MultipartUploadRow.started_at)
        if limit is not None:
            query = query.limit(limit)
        async with self._sessions() as session:
            rows = (await session.execute(query)).scalars().all()
        return [Recorded(r.object_key, r.upload_id, r.started_at) for r in rows]
