"""tuspy, a real tus 1.0 client, against the tus endpoint: a plain upload, one resumed
after its connection was killed mid-stream (inside a chunk), and parallel partial uploads
concatenated. Each ends as one new version of a shared file with the right sha256 and one
content event naming every collaborator (services/upload/tus/)."""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import os

import pytest
from tusclient import client as tus_client
from tusclient.exceptions import TusCommunicationError, TusUploadFailed
from upload.tus.conftest import CHUNK, TusWorld, assert_one_new_version, shared_file
from upload.tus.cutting_proxy import CuttingProxy


def tuspy(world: TusWorld, url: str | None = None, **headers: str) -> tus_client.TusClient:
    """A tuspy client calling as alice (at `url`: the endpoint's creation URL by default)."""
    return tus_client.TusClient(
        url or world.url, headers={"Authorization": "Bearer dev-alice", **headers}
    )


async def serentak_upload_id(world: TusWorld, url: str) -> str:
    """The Serentak upload behind a tus upload URL (its HEAD's Serentak-Upload-Id)."""
    async with world.http() as http:
        head = await http.head(url, headers=world.headers())
    assert head.status_code == 200
    return head.headers["Serentak-Upload-Id"]


async def test_plain_upload_makes_one_version(tus: TusWorld) -> None:
    file_id = await shared_file(tus, "plain.bin")
    data = os.urandom(5 * CHUNK + 1234)
    uploader = tuspy(tus).uploader(
        file_stream=io.BytesIO(data), metadata={"file_id": file_id}, upload_checksum=True
    )
    await asyncio.to_thread(uploader.upload)
    assert uploader.offset == len(data)
    await assert_one_new_version(tus, await serentak_upload_id(tus, uploader.url), file_id, data)


async def test_upload_resumes_inside_a_chunk_after_a_killed_connection(tus: TusWorld) -> None:
    file_id = await shared_file(tus, "resumed.bin")
    data = os.urandom(6 * CHUNK + 99)
    async with CuttingProxy(tus.port, cut_after=2 * CHUNK + CHUNK // 2) as proxy:
        via_proxy = tus.url.replace(f":{tus.port}/", f":{proxy.port}/")
        uploader = tuspy(tus, via_proxy).uploader(
            file_stream=io.BytesIO(data), metadata={"file_id": file_id}
        )
        with pytest.raises((TusUploadFailed, TusCommunicationError)):
            await asyncio.to_thread(uploader.upload)
        assert proxy.cut.is_set()
    url = uploader.url.replace(f":{proxy.port}/", f":{tus.port}/")
    # A new client resumes from the server's offset: every body byte that reached the
    # server before the cut (2.5 chunks less the request head), so inside chunk 2. (tuspy's
    # constructor HEADs the URL, blocking: off the loop the server runs on.)
    resumed = await asyncio.to_thread(tuspy(tus).uploader, file_stream=io.BytesIO(data), url=url)
    assert 2 * CHUNK < resumed.offset < 3 * CHUNK
    await asyncio.to_thread(resumed.upload)
    assert resumed.offset == len(data)
    await assert_one_new_version(tus, await serentak_upload_id(tus, url), file_id, data)


async def test_parallel_partial_uploads_concatenate_into_one_version(tus: TusWorld) -> None:
    file_id = await shared_file(tus, "parts.bin")
    data = os.urandom(5 * CHUNK + 777)
    # Uneven parts, none a multiple of the chunk size: the final re-cuts them into chunks.
    cuts = [0, 100_000, 250_001, len(data)]
    parts = [data[a:b] for a, b in itertools.pairwise(cuts)]
    uploaders = [
        tuspy(tus, **{"Upload-Concat": "partial"}).uploader(file_stream=io.BytesIO(part))
        for part in parts
    ]
    await asyncio.gather(*(asyncio.to_thread(u.upload) for u in uploaders))
    urls = [u.url for u in uploaders]
    async with tus.http() as http:
        final = await http.post(
            tus.url,
            headers=tus.headers(
                Upload_Concat="final;" + " ".join(urls),
                Upload_Metadata="file_id " + _b64(file_id),
            ),
        )
        assert final.status_code == 201, final.text
        head = await http.head(final.headers["Location"], headers=tus.headers())
    assert head.headers["Upload-Concat"] == "final;" + " ".join(urls)
    assert head.headers["Upload-Length"] == head.headers["Upload-Offset"] == str(len(data))
    await assert_one_new_version(tus, final.headers["Serentak-Upload-Id"], file_id, data)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
