"""tus requests spend the upload service's rate-limit families as the RPCs they stand for:
POST as CreateUpload, each stored chunk as a PutChunk (a PATCH pays one, and one more per
chunk after its first), HEAD as GetUpload; past the limit 429 with Retry-After."""

from __future__ import annotations

from typing import Any

import pytest
from upload.tus.conftest import CHUNK, TusWorld, create, patch


@pytest.fixture
def tus_overrides() -> dict[str, Any]:
    # A day's window: fixed windows start afresh at each boundary, and one crossed mid-test
    # would refill the count this test spends.
    return {
        "rate_limit_writes_per_user": 3,
        "rate_limit_writes_per_tenant": 0,
        "rate_limit_window_seconds": 86_400,
    }


async def test_writes_are_limited_like_their_rpcs(tus: TusWorld) -> None:
    async with tus.http() as http:
        made = await create(tus, http, 2 * CHUNK, "limited.bin")  # 1: CreateUpload
        assert made.status_code == 201
        # 2 and 3: a PATCH storing two chunks.
        done = await patch(tus, http, made.headers["Location"], 0, b"x" * (2 * CHUNK))
        assert done.status_code == 204
        # Reads are another family: still answered.
        assert (await http.head(made.headers["Location"], headers=tus.headers())).status_code == 200
        refused = await create(tus, http, 10, "one-too-many.bin")
    assert refused.status_code == 429
    assert refused.headers["Serentak-Error-Reason"] == "RATE_LIMITED"
    assert int(refused.headers["Retry-After"]) >= 1
