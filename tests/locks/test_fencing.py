"""Fencing: a holder that paused past its TTL cannot commit over the new holder's write."""

from __future__ import annotations

import pytest
from serentak.locks.v1 import locks_pb2
from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, insert, select

from services.common.db import create_engine, session_factory
from services.locks.fencing import StaleFencingToken, commit_fenced

pytestmark = pytest.mark.etcd

metadata = MetaData()
files = Table(
    "fenced_files",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("last_lock_token", BigInteger, nullable=False, server_default="0"),
    Column("content", Text, nullable=False),
)


async def test_paused_holder_is_rejected_and_new_holder_commits(lock_service, database_url) -> None:  # type: ignore[no-untyped-def]
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
            await conn.execute(insert(files).values(id=1, content="v0"))
        stub = lock_service.stub
        paused = await stub.Acquire(
            locks_pb2.AcquireRequest(key="file:1", owner="paused", ttl_seconds=2)
        )
        # The first holder "pauses" (no refresh); its lease expires and the next one gets in.
        fresh = await stub.Acquire(
            locks_pb2.AcquireRequest(
                key="file:1", owner="fresh", ttl_seconds=30, wait_timeout_ms=15_000
            )
        )
        assert fresh.token > paused.token
        async with sessions() as session, session.begin():
            await commit_fenced(session, files, 1, fresh.token, {"content": "fresh"})
        # The paused holder wakes up and commits with its old token: refused, row intact.
        with pytest.raises(StaleFencingToken) as caught:
            async with sessions() as session, session.begin():
                await commit_fenced(session, files, 1, paused.token, {"content": "paused"})
        assert caught.value.reason == "STALE_FENCING_TOKEN"
        # The same holder may write again with its own token.
        async with sessions() as session, session.begin():
            await commit_fenced(session, files, 1, fresh.token, {"content": "fresh-2"})
        async with sessions() as session:
            row = (await session.execute(select(files).where(files.c.id == 1))).one()
        assert (row.content, row.last_lock_token) == ("fresh-2", fresh.token)
    finally:
        await engine.dispose()
