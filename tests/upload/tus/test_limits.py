"""The upload service's limits hold for tus uploads: the tenant quota (413 QUOTA_EXCEEDED,
as the spec answers a too-large upload), the open-upload cap per user (partial and deferred
uploads count), each with its reason; nothing is created past them."""

from __future__ import annotations

from typing import Any

import pytest
from upload.tus.conftest import CHUNK, TusWorld, b64, completed_file, create, patch


@pytest.fixture
def tus_overrides() -> dict[str, Any]:
    return {"tenant_quota_bytes": 10 * CHUNK, "max_open_uploads_per_user": 2}


async def test_tenant_quota_and_open_upload_cap(tus: TusWorld) -> None:
    async with tus.http() as http:
        over = await create(tus, http, 11 * CHUNK, "over-quota.bin")
        assert (over.status_code, over.headers["Serentak-Error-Reason"]) == (413, "QUOTA_EXCEEDED")
        first = await create(tus, http, CHUNK, "one.bin")
        partial = await http.post(
            tus.url, headers=tus.headers(Upload_Length="10", Upload_Concat="partial")
        )
        assert (first.status_code, partial.status_code) == (201, 201)
        # Two open: a third of either kind is refused.
        third = await create(tus, http, CHUNK, "three.bin")
        deferred = await http.post(
            tus.url,
            headers=tus.headers(Upload_Defer_Length="1", Upload_Metadata=f"filename {b64('d')}"),
        )
        for refused in (third, deferred):
            assert refused.status_code == 429
            assert refused.headers["Serentak-Error-Reason"] == "TOO_MANY_UPLOADS"
        # Finishing one frees its place.
        assert (
            await patch(tus, http, first.headers["Location"], 0, b"x" * CHUNK)
        ).status_code == 204
        await completed_file(tus, first.headers["Serentak-Upload-Id"])
        again = await create(tus, http, CHUNK, "three.bin")
        assert again.status_code == 201


async def test_partials_at_the_cap_still_make_their_final(tus: TusWorld) -> None:
    async with tus.http() as http:
        parts = []
        for data in (b"hello", b" world"):
            made = await http.post(
                tus.url, headers=tus.headers(Upload_Length=str(len(data)), Upload_Concat="partial")
            )
            assert (await patch(tus, http, made.headers["Location"], 0, data)).status_code == 204
            parts.append(made.headers["Location"])
        final = await http.post(
            tus.url,
            headers=tus.headers(
                Upload_Concat="final;" + " ".join(parts), Upload_Metadata=f"filename {b64('hw')}"
            ),
        )
        assert final.status_code == 201, final.text
    _, stored = await completed_file(tus, final.headers["Serentak-Upload-Id"])
    assert stored == b"hello world"
