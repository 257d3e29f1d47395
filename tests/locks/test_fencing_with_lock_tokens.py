"""Fencing with real lock tokens: a holder that paused past its TTL cannot commit over the
new holder's write. The check is the upload service's one commit path
(`services.upload.files.versions.commit_fenced`, invariant 7), fed tokens from etcd."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from locks.principals import SERVICE_TOKEN, bearer
from serentak.locks.v1 import locks_pb2
from sqlalchemy import insert, select

from services.common.db import create_engine, session_factory
from services.upload.errors import StaleFencingToken
from services.upload.files.versions import commit_fenced
from services.upload.models import FILE, FileRow

pytestmark = pytest.mark.etcd


async def test_paused_holder_is_rejected_and_new_holder_commits(lock_service, database_url) -> None:  # type: ignore[no-untyped-def]
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    now = datetime.now(UTC)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(FileRow.__table__.create)
            await conn.execute(
                insert(FileRow).values(
                    id="f1",
                    tenant_id="acme",
                    name="a.txt",
                    kind=FILE,
                    owner_user_id="alice",
                    checksum="v0",
                    created_at=now,
                    updated_at=now,
                )
            )
        stub = lock_service.stub
        # The file's lock is the merge's: taken as the upload principal, in its tenant.
        merge = bearer(SERVICE_TOKEN)
        paused = await stub.Acquire(
            locks_pb2.AcquireRequest(
                key="file:f1", owner="paused", ttl_seconds=2, tenant_id="acme"
            ),
            metadata=merge,
        )
        # The first holder "pauses" (no refresh); its lease expires and the next one gets in.
        fresh = await stub.Acquire(
            locks_pb2.AcquireRequest(
                key="file:f1",
                owner="fresh",
                ttl_seconds=30,
                wait_timeout_ms=15_000,
                tenant_id="acme",
            ),
            metadata=merge,
        )
        assert fresh.token > paused.token
        async with sessions() as session, session.begin():
            await commit_fenced(session, "f1", fresh.token, checksum="fresh")
        # The paused holder wakes up and commits with its old token: refused, row intact.
        with pytest.raises(StaleFencingToken) as caught:
            async with sessions() as session, session.begin():
                await commit_fenced(session, "f1", paused.token, checksum="paused")
        assert caught.value.reason == "STALE_FENCING_TOKEN"
        # The same holder may write again with its own token.
        async with sessions() as session, session.begin():
            await commit_fenced(session, "f1", fresh.token, checksum="fresh-2")
        async with sessions() as session:
            row = (await session.execute(select(FileRow).where(FileRow.id == "f1"))).scalar_one()
        assert (row.checksum, row.last_lock_token, row.version) == ("fresh-2", fresh.token, 3)
    finally:
        await engine.dispose()
