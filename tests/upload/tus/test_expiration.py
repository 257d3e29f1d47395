"""The expiration extension: Upload-Expires (RFC 9110 date) on POST, PATCH and HEAD of an
unfinished upload; an expired upload answers 410 Gone, and the sweep removes it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

import pytest
from sqlalchemy import update
from upload.tus.conftest import CHUNK, TusWorld, create, patch

from services.common.db import create_engine, session_factory
from services.upload.models import TusUploadRow, UploadRow
from services.upload.storage.blob_store import open_blob_store


def expires(value: str) -> datetime:
    """A parsed Upload-Expires, which must be an IMF-fixdate in GMT."""
    assert value.endswith(" GMT")
    return parsedate_to_datetime(value)


async def test_upload_expires_is_on_every_answer_of_an_unfinished_upload(tus: TusWorld) -> None:
    ttl = timedelta(seconds=tus.settings.upload_ttl_seconds)
    before = datetime.now(UTC).replace(microsecond=0)
    async with tus.http() as http:
        made = await create(tus, http, 2 * CHUNK, "later.bin")
        answers = [
            made,
            await patch(tus, http, made.headers["Location"], 0, b"x" * 100),
            await http.head(made.headers["Location"], headers=tus.headers()),
        ]
        for answer in answers:
            at = expires(answer.headers["Upload-Expires"])
            assert before + ttl <= at <= datetime.now(UTC) + ttl
        done = await patch(tus, http, made.headers["Location"], 100, b"y" * (2 * CHUNK - 100))
        # Finished: nothing of it expires any more.
        assert done.status_code == 204 and "Upload-Expires" not in done.headers


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_an_expired_upload_is_gone_then_swept(tus: TusWorld) -> None:
    async with tus.http() as http:
        parked = await http.post(
            tus.url, headers=tus.headers(Upload_Length=str(CHUNK + 5), Upload_Concat="partial")
        )
        single = await create(tus, http, CHUNK + 5, "expiring.bin")
        for made in (parked, single):
            answer = await patch(tus, http, made.headers["Location"], 0, b"z" * (CHUNK + 1))
            assert answer.status_code == 204
        past = datetime.now(UTC) - timedelta(seconds=1)
        engine = create_engine(tus.settings.database_url)
        try:
            async with session_factory(engine).begin() as session:
                await session.execute(update(TusUploadRow).values(expires_at=past))
                await session.execute(update(UploadRow).values(expires_at=past))
        finally:
            await engine.dispose()
        for made in (parked, single):
            location = made.headers["Location"]
            assert (await http.head(location, headers=tus.headers())).status_code == 410
            answer = await patch(tus, http, location, CHUNK + 1, b"zzzz")
            assert answer.status_code == 410
        store = tus.parts.tus.store  # type: ignore[union-attr]
        parked_id = parked.headers["Location"].rsplit("/", 1)[1]
        assert await _parked_objects(tus, parked_id) == 1
        assert list(store.tails.root.glob(f"{parked_id}.*"))
        assert await store.sweep() == 2
        for made in (parked, single):
            assert (
                await http.head(made.headers["Location"], headers=tus.headers())
            ).status_code == 404
    assert await _parked_objects(tus, parked_id) == 0
    assert not list(store.tails.root.glob(f"{parked_id}.*"))


async def _parked_objects(tus: TusWorld, tus_id: str) -> int:
    """How many blobs a parked upload has (its whole chunks)."""
    blobs = open_blob_store(tus.settings)
    try:
        return len([o async for o in blobs.list_objects(f"tus/{tus_id}")])
    finally:
        await blobs.close()
