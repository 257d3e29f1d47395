"""Tables a test defines for itself, made fresh in the test's database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncEngine

from services.common.db import create_engine


@asynccontextmanager
async def engine_with(database_url: str, metadata: MetaData) -> AsyncIterator[AsyncEngine]:
    """An engine on `database_url` whose `metadata` tables are dropped and made anew;
    disposed of on exit."""
    engine = create_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(metadata.drop_all)
            await connection.run_sync(metadata.create_all)
        yield engine
    finally:
        await engine.dispose()
