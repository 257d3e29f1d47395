"""The sync test world: a migrated database, the fake provider, a wired engine, a worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from upload.sync.fake_provider import FakeProvider

from services.common.jobs.models import dead_letters, jobs
from services.common.jobs.worker import Worker
from services.upload.sync import items
from services.upload.sync.cache import LocalByteCache
from services.upload.sync.engine import SyncEngine
from services.upload.sync.jobs import enqueue_delta_poll
from services.upload.sync.models import linked_drives, synced_items, utcnow
from services.upload.sync.settings import SyncSettings

DRIVE = "drv-1"
ACCOUNT = "acct-1"
TENANT = "acme"
OTHER_TENANT = "evil"
# Each tenant's own provider credential (the dev tokens map alice/bob/carol to acme and
# mallory to evil).
TOKENS = {TENANT: "token-acme", OTHER_TENANT: "token-evil"}


@dataclass
class SyncWorld:
    """A migrated database, the fake provider, a wired engine and a job worker."""

    db: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    fake: FakeProvider
    engine: SyncEngine
    cache: LocalByteCache
    worker: Worker

    async def link_item(self, upstream_item_id: str, **kw: Any) -> str:
        """Insert a synced item for DRIVE (PENDING_RETRY until its first sync)."""
        async with self.sessions() as s, s.begin():
            return await items.insert_item(
                s,
                tenant_id=TENANT,
                account_id=ACCOUNT,
                upstream_drive_id=DRIVE,
                upstream_item_id=upstream_item_id,
                now=utcnow(),
                **kw,
            )

    async def link_drive(
        self, link_id: str, tenant_id: str = TENANT, delta_link: str | None = None
    ) -> None:
        """Insert a link of DRIVE (ACCOUNT) for `tenant_id`, its delta cursor `delta_link`."""
        now = utcnow()
        async with self.sessions() as s, s.begin():
            await s.execute(
                insert(linked_drives).values(
                    id=link_id,
                    tenant_id=tenant_id,
                    account_id=ACCOUNT,
                    upstream_drive_id=DRIVE,
                    delta_link=delta_link,
                    full_resync_count=0,
                    created_at=now,
                    updated_at=now,
                )
            )

    async def poll(self, link_id: str) -> None:
        """Queue a delta poll of `link_id` and run the worker until no job is left."""
        async with self.sessions() as s, s.begin():
            await enqueue_delta_poll(s, link_id, reason="test", dedupe_window_seconds=0)
        await self.drain()

    async def item(self, item_id: str) -> Any:
        """The synced item row."""
        async with self.sessions() as s:
            row = (
                (await s.execute(select(synced_items).where(synced_items.c.id == item_id)))
                .mappings()
                .first()
            )
        assert row is not None
        return row

    async def open_jobs(self) -> list[Any]:
        """Unfinished jobs."""
        async with self.sessions() as s:
            return list((await s.execute(select(jobs))).mappings().all())

    async def dead(self) -> list[Any]:
        """Dead letters."""
        async with self.sessions() as s:
            return list((await s.execute(select(dead_letters))).mappings().all())

    async def run_until(
        self, done: Callable[[], Awaitable[bool]], deadline_s: float = 20.0
    ) -> None:
        """Run the worker until `done()` holds (checked after every job), or fail."""
        deadline = time.monotonic() + deadline_s
        while not await done():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached before the deadline")
            if not await self.worker.run_once():
                # Nothing due yet (a backoff or dedupe window): wait for the queue to
                # have a due job rather than spinning.
                await asyncio.sleep(0.02)

    async def drain(self, deadline_s: float = 20.0) -> None:
        """Run jobs until none is left."""

        async def empty() -> bool:
            return not await self.open_jobs()

        await self.run_until(empty, deadline_s)


def settings(**overrides: Any) -> SyncSettings:
    """Test settings: short backoffs and windows."""
    base: dict[str, Any] = {
        "not_found_backoff_base_seconds": 0.05,
        "not_found_backoff_cap_seconds": 0.2,
        "transient_backoff_base_seconds": 0.05,
        "transient_backoff_cap_seconds": 5.0,
        "webhook_dedupe_seconds": 0.5,
        "client_state": "s3cret",
        "webhook_port": 0,
        "provider_tokens": TOKENS,
    }
    base.update(overrides)
    return SyncSettings(**base)
