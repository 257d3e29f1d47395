"""Serving tombstones: what the FileService calls before answering for a file.

GetFile / Download / ListFolder of a tombstoned synced file answer FAILED_PRECONDITION
with reason FILE_RETENTION_EXPIRED and `status=expired` in the ErrorInfo metadata.
Tombstoned files stay in the database (no hard delete); listings leave them out.
Every lookup is scoped by tenant: only the file's own tenant's tombstone can hide it.
The tree asks through `files.visibility`, where `TOMBSTONES` is registered (sync/__init__.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement, exists, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.upload.files.visibility import HidingRule
from services.upload.sync.errors import FileRetentionExpired
from services.upload.sync.models import TOMBSTONED, synced_items


async def raise_if_tombstoned(session: AsyncSession, tenant_id: str, file_id: str) -> None:
    """Raise FileRetentionExpired if `file_id` is one of the tenant's tombstoned synced files."""
    row = (
        await session.execute(
            select(synced_items.c.tombstoned_at, synced_items.c.tombstone_reason)
            .where(
                synced_items.c.file_id == file_id,
                synced_items.c.tenant_id == tenant_id,
                synced_items.c.status == TOMBSTONED,
            )
            .limit(1)
        )
    ).first()
    if row is not None:
        raise FileRetentionExpired(
            f"file {file_id} is no longer held upstream",
            status="expired",
            file_id=file_id,
            tombstone_reason=row.tombstone_reason,
            tombstoned_at=row.tombstoned_at.isoformat() if row.tombstoned_at else None,
        )


async def hidden_file_ids(
    session: AsyncSession, tenant_id: str, file_ids: Iterable[str] | None = None
) -> set[str]:
    """Ids of the tenant's tombstoned files (of `file_ids` only, when given)."""
    stmt = select(synced_items.c.file_id).where(
        synced_items.c.tenant_id == tenant_id,
        synced_items.c.status == TOMBSTONED,
        synced_items.c.file_id.is_not(None),
    )
    if file_ids is not None:
        ids = list(file_ids)
        if not ids:
            return set()
        stmt = stmt.where(synced_items.c.file_id.in_(ids))
    return {fid for fid in (await session.execute(stmt)).scalars() if fid}


def not_tombstoned(
    file_id_column: ColumnElement[str], tenant_id_column: ColumnElement[str]
) -> ColumnElement[bool]:
    """A WHERE clause for listings: the file is not a tombstoned synced file of its tenant."""
    return ~exists().where(
        synced_items.c.file_id == file_id_column,
        synced_items.c.tenant_id == tenant_id_column,
        synced_items.c.status == TOMBSTONED,
    )


class _Tombstones:
    """The tombstones as the tree's hiding rule (`files.visibility.HidingRule`)."""

    async def raise_if_hidden(self, session: AsyncSession, tenant_id: str, file_id: str) -> None:
        await raise_if_tombstoned(session, tenant_id, file_id)

    async def hidden_ids(
        self, session: AsyncSession, tenant_id: str, file_ids: Iterable[str] | None
    ) -> set[str]:
        return await hidden_file_ids(session, tenant_id, file_ids)

    def visible(
        self, file_id_column: ColumnElement[str], tenant_id_column: ColumnElement[str]
    ) -> ColumnElement[bool]:
        return not_tombstoned(file_id_column, tenant_id_column)


TOMBSTONES: HidingRule = _Tombstones()
