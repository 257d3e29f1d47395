"""Expired tus uploads: their rows, parked chunks and tails, removed on every replica's
schedule (`expiry_interval_seconds`); tail files idle past the TTL too (an upload that
finished or expired on another replica)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.upload.models import TusUploadRow, utcnow
from services.upload.storage.blob_store import BlobStore
from services.upload.tus.pieces import parked_prefix
from services.upload.tus.tails import Tails

SWEEP_BATCH = 500


async def sweep_expired(
    sessions: async_sessionmaker[AsyncSession], blobs: BlobStore, tails: Tails, ttl_seconds: float
) -> int:
    """Delete up to SWEEP_BATCH uploads past expires_at with their bytes; how many."""
    async with sessions() as session:
        ids = list(
            (
                await session.execute(
                    select(TusUploadRow.id)
                    .where(TusUploadRow.expires_at < utcnow())
                    .limit(SWEEP_BATCH)
                )
            ).scalars()
        )
    for tus_id in ids:
        await blobs.delete_prefix(parked_prefix(tus_id))
        await tails.remove(tus_id)
    if ids:
        async with sessions.begin() as session:
            await session.execute(delete(TusUploadRow).where(TusUploadRow.id.in_(ids)))
    await tails.sweep(ttl_seconds)
    return len(ids)
