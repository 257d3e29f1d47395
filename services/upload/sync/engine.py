"""What every sync handler needs, built once in the upload service's app.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.upload.sync.cache import ByteCache
from services.upload.sync.provider import Provider
from services.upload.sync.settings import SyncSettings

# Called by purge, in its transaction, with the file ids of the tombstones it is about to
# delete: the upload service retires those files (they must stay hidden for good) and
# returns the ids that are now gone; a tombstone whose file was not retired is kept.
RetireFiles = Callable[[AsyncSession, Sequence[str]], Awaitable[Collection[str]]]


@dataclass(frozen=True, slots=True)
class SyncEngine:
    """Dependencies of the sync jobs, webhook endpoint and SyncService."""

    settings: SyncSettings
    sessions: async_sessionmaker[AsyncSession]
    provider: Provider
    cache: ByteCache
    # None: tombstones that name a local file keep their row after purge (bytes go).
    retire_files: RetireFiles | None = None
