"""The checksum extension: Upload-Checksum verified over the whole PATCH body before any
byte is applied; 460 on a mismatch, 400 for an unsupported algorithm, the upload as it
was in both cases."""

from __future__ import annotations

import base64
import hashlib
import os

import pytest
from upload.tus.conftest import CHUNK, TusWorld, completed_file, create, offset_of, patch


def checksum(algorithm: str, data: bytes) -> str:
    """An Upload-Checksum value."""
    return f"{algorithm} {base64.b64encode(hashlib.new(algorithm, data).digest()).decode()}"


@pytest.mark.parametrize("algorithm", ["sha1", "sha256", "sha512", "md5"])
async def test_each_announced_algorithm_is_verified(tus: TusWorld, algorithm: str) -> None:
    data = os.urandom(CHUNK + 17)
    async with tus.http() as http:
        location = (await create(tus, http, len(data), f"{algorithm}.bin")).headers["Location"]
        half = CHUNK // 2
        # A body that is not the one hashed: 460, nothing applied (not even its full chunk).
        corrupt = data[:half] + bytes([data[half] ^ 1]) + data[half + 1 :]
        refused = await patch(
            tus, http, location, 0, corrupt, Upload_Checksum=checksum(algorithm, data)
        )
        assert refused.status_code == 460 and refused.reason_phrase == "Checksum Mismatch"
        assert await offset_of(tus, http, location) == 0
        ok = await patch(
            tus, http, location, 0, data[:half], Upload_Checksum=checksum(algorithm, data[:half])
        )
        assert (ok.status_code, ok.headers["Upload-Offset"]) == (204, str(half))
        done = await patch(
            tus, http, location, half, data[half:], Upload_Checksum=checksum(algorithm, data[half:])
        )
        assert done.status_code == 204
    _, stored = await completed_file(tus, done.headers["Serentak-Upload-Id"])
    assert stored == data


async def test_unsupported_algorithm_or_bad_digest_is_400(tus: TusWorld) -> None:
    async with tus.http() as http:
        location = (await create(tus, http, 10, "algo.bin")).headers["Location"]
        for value in ("crc32 AAAAAA==", "sha256 not-base64!", "sha256 AAAA", "SHA1 " + "A" * 28):
            answer = await patch(tus, http, location, 0, b"0123456789", Upload_Checksum=value)
            assert answer.status_code == 400, value
        assert await offset_of(tus, http, location) == 0
