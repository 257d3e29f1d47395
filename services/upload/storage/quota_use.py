"""The highest tenant's share of its storage quota, as a gauge (the near-quota alert).

Usage is what CreateUpload's quota check counts (`ingest/allowance.py`): the sizes of a
tenant's files (current versions, trash included; `tenant_usage`, kept by triggers) plus
the declared sizes of its open (`uploading` / `merging`) uploads. It runs every minute at
most, on every replica (alerts take the max); a tenant past 90 % is logged
by name, which the gauge (one series, no tenant label) cannot say.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.logging import get_logger
from services.upload import metrics
from services.upload.models import MERGING, UPLOADING, TenantUsageRow, UploadRow

log = get_logger(__name__)

NEAR_QUOTA = 0.9
MIN_INTERVAL_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """The tenant using the largest share of the quota (none: "" and 0)."""

    tenant_id: str
    used_bytes: int
    ratio: float


async def highest_quota_use(session: AsyncSession, quota_bytes: int) -> QuotaUse:
    """The tenant closest to (or furthest past) `quota_bytes`."""
    used: dict[str, int] = {}
    stored = select(TenantUsageRow.tenant_id, TenantUsageRow.stored_bytes)
    open_uploads = (
        select(UploadRow.tenant_id, func.coalesce(func.sum(UploadRow.total_size), 0))
        .where(UploadRow.status.in_((UPLOADING, MERGING)))
        .group_by(UploadRow.tenant_id)
    )
    for stmt in (stored, open_uploads):
        for tenant_id, size in await session.execute(stmt):
            used[tenant_id] = used.get(tenant_id, 0) + int(size or 0)
    if not used or quota_bytes <= 0:
        return QuotaUse("", 0, 0.0)
    tenant_id = max(used, key=lambda t: used[t])
    return QuotaUse(tenant_id, used[tenant_id], used[tenant_id] / quota_bytes)


async def refresh_quota_use(
    sessions: async_sessionmaker[AsyncSession], quota_bytes: int
) -> QuotaUse:
    """Read once, set `serentak_upload_tenant_quota_used_ratio_max`, log a tenant near it."""
    async with sessions() as session:
        use = await highest_quota_use(session, quota_bytes)
    metrics.QUOTA_USED_RATIO_MAX.set(use.ratio)
    if use.ratio >= NEAR_QUOTA:
        log.warning(
            "tenant_near_quota",
            tenant_id=use.tenant_id,
            used_bytes=use.used_bytes,
            quota_bytes=quota_bytes,
        )
    return use


async def sample_quota_use(
    sessions: async_sessionmaker[AsyncSession], quota_bytes: int, interval: float
) -> None:
    """Refresh the gauge every max(`interval`, 60 s), forever (a failed read is logged)."""
    while True:
        try:
            await refresh_quota_use(sessions, quota_bytes)
        except Exception:
            log.exception("quota_use_failed")
        await asyncio.sleep(max(interval, MIN_INTERVAL_SECONDS))
