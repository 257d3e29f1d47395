"""How long the oldest upload has sat in `uploading` and in `merging`, as a gauge.

Every replica samples it on its own (like the job runtime's queue gauges), so a replica that
stops sampling never leaves a stale value behind on another: alerts take the max.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.logging import get_logger
from services.upload import metrics
from services.upload.models import MERGING, UPLOADING, UploadRow, utcnow

log = get_logger(__name__)


def _aware(value: datetime | str | None) -> datetime | None:
    # SQLite returns MIN() over a timestamp column as naive text.
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=utcnow().tzinfo)
    return value


async def oldest_in_status(session: AsyncSession) -> dict[str, float]:
    """Seconds since the oldest `uploading` upload was created / `merging` one began merging."""
    now = utcnow()
    since = {UPLOADING: UploadRow.created_at, MERGING: UploadRow.merge_started_at}
    ages: dict[str, float] = {}
    for status, column in since.items():
        oldest = _aware(
            await session.scalar(select(func.min(column)).where(UploadRow.status == status))
        )
        ages[status] = max((now - oldest).total_seconds(), 0.0) if oldest else 0.0
    return ages


async def refresh_status_ages(sessions: async_sessionmaker[AsyncSession]) -> dict[str, float]:
    """Read the ages once and set `serentak_upload_oldest_in_status_seconds`."""
    async with sessions() as session:
        ages = await oldest_in_status(session)
        missing = int(
            await session.scalar(
                select(func.count())
                .select_from(UploadRow)
                .where(
                    UploadRow.status == UPLOADING,
                    UploadRow.received_chunk_count < UploadRow.total_chunks,
                )
            )
            or 0
        )
    for status, age in ages.items():
        metrics.OLDEST_IN_STATUS.labels(status).set(age)
    metrics.UPLOADS_MISSING_CHUNKS.set(missing)
    return ages


async def sample_status_ages(sessions: async_sessionmaker[AsyncSession], interval: float) -> None:
    """Refresh the gauge every `interval` seconds, forever (a failed read is logged)."""
    while True:
        try:
            await refresh_status_ages(sessions)
        except Exception:
            log.exception("status_ages_failed")
        await asyncio.sleep(interval)
