"""A merge SIGKILLed inside merge_core (its `*.merge-tmp` half written): the restarted
service finishes the merge within seconds (short job lease; the merge lock's lease is short
too), the re-run merge deletes its predecessor's temp file, and the bytes are exact.

The merge is stopped deterministically: the last chunk's file is swapped for a FIFO with
no writer, so merge_core, having created its temp output and written the earlier chunks,
blocks opening it. The test waits for the temp file (observable), then kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.services import service_process
from upload.upload_helpers import chunk_request, create_request, split, wait_status

CHUNK = 4096
TEMP_SUFFIX = ".merge-tmp"


def _temp_files(root) -> list:
    return list(root.rglob(f"*{TEMP_SUFFIX}")) if root.exists() else []


async def _wait_for(predicate, what: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"never saw {what}"
        await asyncio.sleep(0.05)


async def test_killed_merge_resumes_quickly_and_cleans_its_temp_file(
    database_url, tmp_path, locks_address
) -> None:
    env = {
        "SERENTAK_UPLOAD_DATABASE_URL": database_url,
        "SERENTAK_LOCKS_ADDRESS": locks_address,
        "SERENTAK_MIN_CHUNK_SIZE": "1024",
        # The defaults under test: job lease and merge lock lease (10 s each).
        "SERENTAK_WORKER_POLL_SECONDS": "0.1",
        "SERENTAK_LOG_FORMAT": "json",
        "SERENTAK_SYNC_WEBHOOK_PORT": "0",
    }
    md = (("authorization", "Bearer dev-alice"),)
    data = os.urandom(CHUNK * 6 + 10)
    chunks = split(data, CHUNK)
    last = len(chunks) - 1
    blobs = tmp_path / "data" / "blobs"
    stuck = last - 1
    stuck_path = "data/blobs/uploads/{upload_id}/" + str(stuck)
    with contextlib.ExitStack() as stack:
        proc = await asyncio.to_thread(
            stack.enter_context, service_process("upload", tmp_path, env)
        )
        async with grpc.aio.insecure_channel(proc.address) as channel:
            stub = upload_pb2_grpc.UploadServiceStub(channel)
            upload = await stub.CreateUpload(create_request(data, CHUNK), metadata=md)
            for i, c in enumerate(chunks[:last]):
                await stub.PutChunk(chunk_request(upload.upload_id, i, c), metadata=md)
            # Before the last chunk starts the merge, an earlier chunk's file becomes a FIFO.
            path = tmp_path / str(stuck_path).format(upload_id=upload.upload_id)
            path.unlink()
            os.mkfifo(path, 0o600)
            await stub.PutChunk(chunk_request(upload.upload_id, last, chunks[last]), metadata=md)
            await _wait_for(lambda: _temp_files(blobs), "the merge's temp file")
        proc.process.send_signal(signal.SIGKILL)
        proc.process.wait()
    left = _temp_files(blobs)
    assert len(left) == 1, left  # what SIGKILL leaves behind (issue 17)
    path.unlink()
    path.write_bytes(chunks[stuck])
    path.chmod(0o600)

    with contextlib.ExitStack() as stack:
        restarted = time.monotonic()
        proc = await asyncio.to_thread(
            stack.enter_context, service_process("upload", tmp_path, env)
        )
        async with grpc.aio.insecure_channel(proc.address) as channel:
            client = type("C", (), {})()
            client.uploads = upload_pb2_grpc.UploadServiceStub(channel)
            client.metadata = md
            done = await wait_status(client, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
            recovery = time.monotonic() - restarted
            print(f"killed merge completed {recovery:.1f} s after the restart (target 15 s)")
            assert done.file_version == 1
            merged = blobs / "files" / done.file_id / done.upload_id
            assert merged.read_bytes() == data
    # The re-run merge deleted its predecessor's temp file.
    assert _temp_files(blobs) == []
