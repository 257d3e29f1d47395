"""The concatenation extension at the HTTP level: partial uploads report their offset and
Upload-Concat, a final upload takes no PATCH (403), needs finished partials of the
caller's and no Upload-Length (400); an empty final makes an empty file."""

from __future__ import annotations

import os

import httpx
import pytest
from upload.tus.conftest import CHUNK, TusWorld, b64, completed_file, patch


async def partial(
    world: TusWorld, http: httpx.AsyncClient, data: bytes, user: str = "alice"
) -> str:
    """A partial upload holding `data` (sent whole); its Location."""
    made = await http.post(
        world.url,
        headers=world.headers(user, Upload_Length=str(len(data)), Upload_Concat="partial"),
    )
    assert made.status_code == 201, made.text
    assert made.headers["Upload-Concat"] == "partial" and "Serentak-Upload-Id" not in made.headers
    if data:
        assert (
            await patch(world, http, made.headers["Location"], 0, data, user)
        ).status_code == 204
    return made.headers["Location"]


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_final_refusals_and_partial_heads(tus: TusWorld) -> None:
    data = os.urandom(CHUNK + 3)
    async with tus.http() as http:
        done = await partial(tus, http, data)
        head = await http.head(done, headers=tus.headers())
        assert (head.headers["Upload-Offset"], head.headers["Upload-Concat"]) == (
            str(len(data)),
            "partial",
        )
        unfinished = await http.post(
            tus.url, headers=tus.headers(Upload_Length="10", Upload_Concat="partial")
        )
        name = f"filename {b64('final.bin')}"

        async def final(urls: str, user: str = "alice", **extra: str) -> int:
            answer = await http.post(
                tus.url,
                headers=tus.headers(
                    user, Upload_Concat=f"final;{urls}", Upload_Metadata=name, **extra
                ),
            )
            return answer.status_code

        assert await final(f"{done} {unfinished.headers['Location']}") == 400
        assert await final(done, Upload_Length=str(len(data))) == 400
        assert await final(done, "mallory") == 404
        assert await final("/elsewhere/abc") == 400
        single = await http.post(
            tus.url, headers=tus.headers(Upload_Length="4", Upload_Metadata=name)
        )
        assert await final(single.headers["Location"]) == 400
        # A final of the same partial twice: its bytes twice, in order.
        made = await http.post(
            tus.url,
            headers=tus.headers(Upload_Concat=f"final;{done} {done}", Upload_Metadata=name),
        )
        assert made.status_code == 201
        refused = await patch(tus, http, made.headers["Location"], 2 * len(data), b"more")
        assert refused.status_code == 403
    _, stored = await completed_file(tus, made.headers["Serentak-Upload-Id"])
    assert stored == data + data


async def test_empty_partials_make_an_empty_file(tus: TusWorld) -> None:
    async with tus.http() as http:
        empty = await partial(tus, http, b"")
        made = await http.post(
            tus.url,
            headers=tus.headers(
                Upload_Concat=f"final;{empty}", Upload_Metadata=f"filename {b64('nothing')}"
            ),
        )
        assert made.status_code == 201, made.text
    _, stored = await completed_file(tus, made.headers["Serentak-Upload-Id"])
    assert stored == b""
