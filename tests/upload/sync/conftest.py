"""Fixtures of the sync engine tests: migrated DB (both backends), fake provider, worker.

The database carries the whole upload schema (files, shares, jobs, sync tables): linking
a file checks the caller's role on it in the upload service's own tables.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from upload.sync.fake_provider import FakeProvider
from upload.sync.sync_world import TOKENS, SyncWorld, settings

from services.common.db import create_engine, session_factory
from services.common.jobs.registry import JobRegistry
from services.common.jobs.worker import Worker
from services.upload.database import migrate
from services.upload.sync.cache import LocalByteCache
from services.upload.sync.engine import SyncEngine
from services.upload.sync.graph import GraphProvider
from services.upload.sync.settings import SyncSettings
from services.upload.sync.wiring import register_sync_jobs


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    """The fake provider, started."""
    async with FakeProvider() as provider:
        yield provider


@pytest.fixture
def sync_settings() -> SyncSettings:
    """Override in a test module to change knobs."""
    return settings()


@pytest.fixture
async def world(
    database_url: str, fake: FakeProvider, tmp_path: Path, sync_settings: SyncSettings
) -> AsyncIterator[SyncWorld]:
    """Everything wired on a fresh database (each backend)."""
    migrate(database_url)
    db = create_engine(database_url, sqlite_synchronous="NORMAL")
    sessions = session_factory(db)
    provider = GraphProvider(fake.base_url, TOKENS, timeout_seconds=5.0)
    cache = LocalByteCache(tmp_path / "cache")
    engine = SyncEngine(settings=sync_settings, sessions=sessions, provider=provider, cache=cache)
    registry = JobRegistry()
    register_sync_jobs(registry, engine)
    worker = Worker(sessions, registry, worker_id="test-worker", poll_interval=0.05)
    yield SyncWorld(db, sessions, fake, engine, cache, worker)
    await provider.aclose()
    await db.dispose()
