"""Fixtures of the job runtime tests: a migrated database (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from services.common.db import create_engine, session_factory
from services.common.migrate import upgrade
from services.common.runtime_migrations import migration_location


@dataclass
class RuntimeDb:
    """A database with the runtime's tables: its URL, engine and sessions."""

    url: str
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    @property
    def dialect(self) -> str:
        """sqlite or postgresql."""
        return self.engine.dialect.name


@pytest.fixture
async def runtime_db(database_url: str) -> AsyncIterator[RuntimeDb]:
    """A fresh database (each backend) migrated to the runtime's head."""
    upgrade(database_url, [migration_location()])
    engine = create_engine(database_url, sqlite_synchronous="NORMAL")
    yield RuntimeDb(database_url, engine, session_factory(engine))
    await engine.dispose()
