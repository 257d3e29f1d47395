"""The upload process SIGKILLed while 4 senders' chunks are being group-committed: every
chunk acknowledged before the kill is there after the restart (its row: not among
GetUpload's missing ranges; its bytes: the merge checks every chunk's checksum and the
file's), chunks cut mid-batch are simply missing (a staged or orphan file is replaced by
the resend), and the file completes exactly once. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os

import grpc
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import chunk_request, content_updated_uploads, create_request, split
from upload.upload_process import ALICE, kill, upload_env, upload_process, wait_completed

CHUNK = 64 * 1024
COUNT = 48
SENDERS = 4
KILL_AFTER = 12


async def test_acknowledged_chunks_survive_a_kill_mid_ingest(
    database_url, tmp_path, locks_address
) -> None:
    env = upload_env(database_url, locks_address)
    data = os.urandom(CHUNK * COUNT)
    chunks = split(data, CHUNK)
    acked: set[int] = set()
    enough = asyncio.Event()
    async with upload_process(tmp_path, env) as (proc, stub):
        upload = await stub.CreateUpload(create_request(data, CHUNK), metadata=ALICE)
        todo = list(range(COUNT))

        async def sender() -> None:
            while todo:
                index = todo.pop(0)
                request = chunk_request(upload.upload_id, index, chunks[index])
                try:
                    await stub.PutChunk(request, metadata=ALICE)
                except grpc.aio.AioRpcError:
                    return  # the server is gone
                acked.add(index)
                if len(acked) >= KILL_AFTER:
                    enough.set()

        senders = [asyncio.create_task(sender()) for _ in range(SENDERS)]
        async with asyncio.timeout(60):
            await enough.wait()
        kill(proc)  # the other senders' chunks are in flight (queued, committing)
        acked_before_kill = set(acked)
        await asyncio.gather(*senders)
    assert len(acked_before_kill) < COUNT, "the kill came after the last chunk"

    async with upload_process(tmp_path, env) as (proc, stub):
        status = await stub.GetUpload(
            upload_pb2.GetUploadRequest(upload_id=upload.upload_id), metadata=ALICE
        )
        missing = {i for r in status.missing_ranges for i in range(r.start, r.end)}
        # Every acknowledged chunk's row is durable; the counter matches the rows.
        assert not acked_before_kill & missing
        assert status.received_chunk_count == COUNT - len(missing)
        assert missing, "the kill came after the last chunk"
        for index in sorted(missing):
            await stub.PutChunk(
                chunk_request(upload.upload_id, index, chunks[index]), metadata=ALICE
            )
        done = await wait_completed(stub, upload.upload_id)
        merged = tmp_path / "data" / "blobs" / "files" / done.file_id / done.upload_id
        assert merged.read_bytes() == data  # every chunk's bytes, acked before the kill or resent
    assert await content_updated_uploads(database_url) == [upload.upload_id]
