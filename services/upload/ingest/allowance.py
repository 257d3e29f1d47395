"""What one caller may still upload: upload size, open uploads per user, tenant quota.

Refusals are RESOURCE_EXHAUSTED with their reason (UPLOAD_TOO_LARGE, TOO_MANY_UPLOADS,
QUOTA_EXCEEDED). The quota counts the tenant's current file versions (trash included:
deleted files still take space) plus its open (uploading, merging) uploads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import String, bindparam, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from services.common import group_reads
from services.common.auth import Identity
from services.common.session_sql import SessionStatement
from services.upload.errors import QuotaExceeded, TooManyUploads, UploadTooLarge
from services.upload.files.versions import pending_file_bytes
from services.upload.models import MERGING, UPLOADING, TenantUsageRow, UploadRow
from services.upload.settings import UploadSettings

_OPEN = (UPLOADING, MERGING)


def _figures() -> Any:
    """The caller's open uploads, the tenant's open bytes and its stored bytes: three
    figures in one statement, built once."""
    tenant_id = bindparam("tenant_id", type_=String)
    # The statuses spelled out: a driver statement has no expanding IN (session_sql).
    is_open = or_(*(UploadRow.status == status for status in _OPEN))
    mine_q = select(func.count()).where(
        UploadRow.tenant_id == tenant_id,
        UploadRow.owner_user_id == bindparam("user_id", type_=String),
        is_open,
    )
    open_q = select(func.coalesce(func.sum(UploadRow.total_size), 0)).where(
        UploadRow.tenant_id == tenant_id, is_open
    )
    # One row kept by triggers on files (TenantUsageRow), not a sum over every file.
    stored_q = select(func.coalesce(func.sum(TenantUsageRow.stored_bytes), 0)).where(
        TenantUsageRow.tenant_id == tenant_id
    )
    return select(mine_q.scalar_subquery(), open_q.scalar_subquery(), stored_q.scalar_subquery())


_FIGURES = SessionStatement(_figures())
_ALLOWANCE_LOCK = SessionStatement(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"))


class _AllowanceFigures:
    """The allowance check's read: (tenant, user) -> (the user's open uploads, the
    tenant's open bytes, its stored bytes), after taking the tenant's allowance lock on
    PostgreSQL (`check_allowance`). It answers for the first key's tenant only: that lock
    and the tenant's tree lock, which the caller holds, keep the figures current until the
    transaction ends (a new upload takes the one, a commit of content the other)."""

    async def read(
        self, session: AsyncSession, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, int, int]]:
        tenant_id = keys[0][0]
        if session.get_bind().dialect.name == "postgresql":
            await _ALLOWANCE_LOCK.rows(session, {"key": f"upload-allowance:{tenant_id}"})
        found = {}
        for key in keys:
            if key[0] == tenant_id:
                values = {"tenant_id": tenant_id, "user_id": key[1]}
                mine, open_bytes, stored = await _FIGURES.one(session, values)
                found[key] = (int(mine or 0), int(open_bytes or 0), int(stored or 0))
        return found


ALLOWANCE_FIGURES = _AllowanceFigures()


def check_size(settings: UploadSettings, total_size: int) -> None:
    """UPLOAD_TOO_LARGE past `max_upload_bytes`."""
    if total_size > settings.max_upload_bytes:
        raise UploadTooLarge(
            f"an upload may hold at most {settings.max_upload_bytes} bytes",
            limit=settings.max_upload_bytes,
            requested=total_size,
        )


async def check_allowance(
    session: AsyncSession, settings: UploadSettings, identity: Identity, total_size: int
) -> None:
    """Refuse past the user's open-upload cap or the tenant's quota, in the transaction
    that then inserts the upload.

    The check and the insert must not interleave with another CreateUpload of the
    tenant, or two could each see room for one: SQLite's BEGIN IMMEDIATE already
    serialises writers; on PostgreSQL a transaction-scoped advisory lock per tenant does.
    In a group commit the figures are read with the next units' (`group_reads`).
    """
    mine, open_bytes, stored = await group_reads.read(
        session, ALLOWANCE_FIGURES, (identity.tenant_id, identity.user_id)
    )
    cap = settings.max_open_uploads_per_user
    if mine >= cap:
        raise TooManyUploads(
            f"at most {cap} open uploads per user; finish or abort one first", limit=cap
        )
    # A group commit's earlier units' new files are not in the stored figure yet.
    used = open_bytes + stored + pending_file_bytes(session, identity.tenant_id)
    quota = settings.tenant_quota_bytes
    if used + total_size > quota:
        raise QuotaExceeded(
            f"the tenant's quota of {quota} bytes has {max(0, quota - used)} bytes left",
            quota=quota,
            used=used,
            requested=total_size,
        )
