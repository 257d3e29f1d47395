"""Reads and writes of synced items and linked drives (the statements that matter).

TOMBSTONED is terminal: every write below that could move an item is conditional on
`status != 'TOMBSTONED'`, so a late 200 or a replayed delta page never resurrects one.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncSession

from services.upload.sync.models import (
    PENDING_RETRY,
    SYNCED,
    TOMBSTONED,
    linked_drives,
    synced_items,
)
from services.upload.sync.provider import UpstreamItem


def new_id() -> str:
    """A fresh 32-hex id."""
    return uuid.uuid4().hex


async def load_item(
    session: AsyncSession, item_id: str, *, for_update: bool = False
) -> RowMapping | None:
    """One synced item by id (row-locked on PostgreSQL when `for_update`)."""
    stmt = select(synced_items).where(synced_items.c.id == item_id)
    if for_update:
        stmt = stmt.with_for_update()
    return (await session.execute(stmt)).mappings().first()


async def load_drive(session: AsyncSession, drive_id: str) -> RowMapping | None:
    """One linked drive by id."""
    stmt = select(linked_drives).where(linked_drives.c.id == drive_id)
    return (await session.execute(stmt)).mappings().first()


def _metadata(item: UpstreamItem) -> dict[str, Any]:
    return {
        "name": item.name[:255],
        "size": item.size,
        "etag": item.etag[:255],
        "upstream_modified_at": item.modified_at,
        "expires_at": item.expires_at,
    }


async def tombstone(session: AsyncSession, item_id: str, reason: str, now: datetime) -> bool:
    """Make the item TOMBSTONED (rows kept); False if it already was."""
    result = await session.execute(
        update(synced_items)
        .where(synced_items.c.id == item_id, synced_items.c.status != TOMBSTONED)
        .values(
            status=TOMBSTONED,
            tombstoned_at=now,
            tombstone_reason=reason,
            next_retry_at=None,
            updated_at=now,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def mark_synced(
    session: AsyncSession, item_id: str, item: UpstreamItem, now: datetime
) -> bool:
    """Store fresh metadata: SYNCED, retry count 0. False if the item is tombstoned."""
    result = await session.execute(
        update(synced_items)
        .where(synced_items.c.id == item_id, synced_items.c.status != TOMBSTONED)
        .values(
            **_metadata(item),
            status=SYNCED,
            retry_count=0,
            last_status_code=200,
            last_error=None,
            next_retry_at=None,
            last_synced_at=now,
            updated_at=now,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def mark_pending_retry(
    session: AsyncSession,
    item_id: str,
    *,
    retry_count: int,
    status_code: int,
    error: str,
    next_retry_at: datetime,
    now: datetime,
) -> bool:
    """PENDING_RETRY with the new 404 count; False if the item is tombstoned."""
    result = await session.execute(
        update(synced_items)
        .where(synced_items.c.id == item_id, synced_items.c.status != TOMBSTONED)
        .values(
            status=PENDING_RETRY,
            retry_count=retry_count,
            last_status_code=status_code,
            last_error=error[:2000],
            next_retry_at=next_retry_at,
            updated_at=now,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def find_upstream(
    session: AsyncSession, tenant_id: str, account_id: str, upstream_item_id: str
) -> RowMapping | None:
    """The tenant's synced item for an upstream id in one provider account."""
    stmt = select(synced_items).where(
        synced_items.c.tenant_id == tenant_id,
        synced_items.c.account_id == account_id,
        synced_items.c.upstream_item_id == upstream_item_id,
    )
    return (await session.execute(stmt)).mappings().first()


async def insert_item(
    session: AsyncSession,
    *,
    tenant_id: str,
    account_id: str,
    upstream_drive_id: str,
    upstream_item_id: str,
    now: datetime,
    drive_id: str | None = None,
    file_id: str | None = None,
    status: str = PENDING_RETRY,
    item: UpstreamItem | None = None,
    cache_key: str | None = None,
) -> str:
    """Insert a synced item; returns its id. PENDING_RETRY until its first successful GET."""
    item_id = new_id()
    values: dict[str, Any] = {
        "id": item_id,
        "tenant_id": tenant_id,
        "account_id": account_id,
        "upstream_drive_id": upstream_drive_id,
        "upstream_item_id": upstream_item_id,
        "drive_id": drive_id,
        "file_id": file_id,
        "status": status,
        "name": "",
        "size": 0,
        "etag": "",
        "retry_count": 0,
        "cache_key": cache_key,
        "created_at": now,
        "updated_at": now,
    }
    if item is not None:
        values.update(_metadata(item), last_synced_at=now, last_status_code=200)
    await session.execute(insert(synced_items).values(values))
    return item_id
