"""Seed 004 repro harness, first half: the client cuts its call mid-message (a PutChunk
cancelled while its 256 KiB body is in flight, on a channel that is then closed), and
retries every chunk on a new connection. Whatever each cut call did on the server (nothing,
stored, or stored after the client left), the upload ends with exactly one merge, one
content event and identical bytes."""

from __future__ import annotations

import asyncio
import os

import grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from upload.upload_helpers import (
    chunk_request,
    content_updated_uploads,
    create_request,
    download,
    split,
    wait_status,
)

CHUNK = 256 * 1024


async def test_cut_calls_then_retries_merge_once(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 4 + 123)
    chunks = split(data, CHUNK)
    up = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    # Cut: every chunk's call is started and cancelled at once on a private connection,
    # which is then closed (the connection drop of the seed).
    cut = grpc.aio.insecure_channel(cluster.address)
    stub = upload_pb2_grpc.UploadServiceStub(cut)
    calls = [
        stub.PutChunk(chunk_request(up.upload_id, i, c), metadata=alice.metadata)
        for i, c in enumerate(chunks)
    ]
    await asyncio.sleep(0)  # let the calls start sending before they are cut
    for call in calls:
        call.cancel()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    await cut.close()
    assert all(
        isinstance(o, upload_pb2.PutChunkResponse)
        or (isinstance(o, grpc.aio.AioRpcError) and o.code() == grpc.StatusCode.CANCELLED)
        or isinstance(o, asyncio.CancelledError)
        for o in outcomes
    ), outcomes
    # Retry everything on a fresh connection: each answer is stored or duplicate.
    for i, c in enumerate(chunks):
        await alice.uploads.PutChunk(chunk_request(up.upload_id, i, c), metadata=alice.metadata)
    done = await wait_status(alice, up.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    got, _ = await download(alice, done.file_id)
    assert got == data
    assert await content_updated_uploads(cluster.settings.database_url) == [up.upload_id]
