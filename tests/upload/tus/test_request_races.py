"""Racing requests on one upload: on a replica they take turns (request_locks.py), so of
two PATCHes sent at the same offset one applies and the other is 409, and a HEAD racing
them sees an offset before or after a PATCH, never inside one. Across replicas a tail
stays with its replica: another one reports the last whole chunk and the client resumes
there (tails.py)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace

import httpx
from support.services import running_app
from upload.tus.conftest import CHUNK, TusWorld, completed_file, create, offset_of, patch

from services.common.jobs import RuntimeOptions
from services.upload.app import assemble
from services.upload.sync.settings import SyncSettings

ROUNDS = 12


async def test_racing_patches_at_one_offset_apply_once(tus: TusWorld) -> None:
    piece = CHUNK // 3 + 11
    data = os.urandom(ROUNDS * piece)
    async with tus.http() as http:
        location = (await create(tus, http, len(data), "raced.bin")).headers["Location"]
        for at in range(0, len(data), piece):
            body = data[at : at + piece]
            first, second, head = await asyncio.gather(
                patch(tus, http, location, at, body),
                patch(tus, http, location, at, body),
                http.head(location, headers=tus.headers()),
            )
            assert sorted([first.status_code, second.status_code]) == [204, 409]
            assert int(head.headers["Upload-Offset"]) in (at, at + len(body))
            assert await offset_of(tus, http, location) == at + len(body)
        upload_id = (await http.head(location, headers=tus.headers())).headers["Serentak-Upload-Id"]
    _, stored = await completed_file(tus, upload_id)
    assert stored == data


async def test_another_replica_resumes_from_the_last_whole_chunk(
    tus: TusWorld, runtime_options: RuntimeOptions, tmp_path
) -> None:
    other = replace(runtime_options, node_id=f"{runtime_options.node_id}-b")
    # Same database and blobs, its own tail folder (another machine's disk).
    settings_b = tus.settings.model_copy(update={"tus_dir": tmp_path / "tails-b"})
    app_b, parts_b = assemble(settings_b, other, SyncSettings(webhook_port=0))
    assert parts_b.tus is not None
    data = os.urandom(3 * CHUNK + 7)
    async with running_app(app_b), tus.http() as http_a:
        await asyncio.wait_for(parts_b.tus.started.wait(), 30)
        location = (await create(tus, http_a, len(data), "replicas.bin")).headers["Location"]
        assert (await patch(tus, http_a, location, 0, data[: CHUNK + 100])).status_code == 204
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{parts_b.tus.port}") as http_b:
            # A has chunk 0 stored and 100 bytes staged; B sees only the chunk.
            assert await offset_of(tus, http_a, location) == CHUNK + 100
            assert await offset_of(tus, http_b, location) == CHUNK
            behind = await patch(tus, http_b, location, CHUNK + 100, data[CHUNK + 100 :])
            assert behind.status_code == 409
            done = await patch(tus, http_b, location, CHUNK, data[CHUNK:])
            assert (done.status_code, done.headers["Upload-Offset"]) == (204, str(len(data)))
        # A's tail is stale now (its chunk is stored): A reports the finished upload.
        assert await offset_of(tus, http_a, location) == len(data)
    _, stored = await completed_file(tus, done.headers["Serentak-Upload-Id"])
    assert stored == data
