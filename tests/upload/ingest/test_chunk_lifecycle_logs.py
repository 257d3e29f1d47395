"""Chunk lifecycle logs (seed 004): one correlation id followed through the JSON log of a
real upload process: every chunk received, validated and stored (upload_id, chunk_index,
total_chunks, checksum, attempt), a resend logged duplicate, other bytes logged conflict,
the status transitions `uploading → merging → completed`, and the merge job's lock and commit lines
with the fencing token, under the PutChunk's correlation id."""

from __future__ import annotations

import json
import os
import uuid

import grpc
from upload.upload_helpers import chunk_request, create_request, split
from upload.upload_process import ALICE, upload_env, upload_process, wait_completed

CHUNK = 1024


async def test_one_correlation_id_from_put_chunk_to_commit(
    database_url, tmp_path, locks_address
) -> None:
    env = upload_env(database_url, locks_address)
    cid = f"seed004-{uuid.uuid4().hex[:10]}"
    md = (*ALICE, ("x-correlation-id", cid))
    data = os.urandom(CHUNK * 3)
    chunks = split(data, CHUNK)
    async with upload_process(tmp_path, env) as (proc, stub):
        up = await stub.CreateUpload(create_request(data, CHUNK), metadata=md)
        await stub.PutChunk(chunk_request(up.upload_id, 0, chunks[0]), metadata=md)
        dup = await stub.PutChunk(chunk_request(up.upload_id, 0, chunks[0]), metadata=md)
        assert dup.duplicate
        try:
            await stub.PutChunk(chunk_request(up.upload_id, 0, b"x" * CHUNK), metadata=md)
            raise AssertionError("a conflicting chunk was accepted")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.ALREADY_EXISTS
        for i in (1, 2):
            await stub.PutChunk(chunk_request(up.upload_id, i, chunks[i]), metadata=md)
        done = await wait_completed(stub, up.upload_id, md)
    lines = [json.loads(x) for x in proc.log_text().splitlines() if x.startswith("{")]
    mine = [r for r in lines if r.get("correlation_id") == cid]
    events = [r["event"] for r in mine]

    def of(event: str) -> list[dict]:
        return [r for r in mine if r["event"] == event]

    for name in ("chunk_received", "chunk_validated"):
        assert sorted(r["chunk_index"] for r in of(name)) == [0, 0, 0, 1, 2], name
    assert sorted(r["chunk_index"] for r in of("chunk_stored")) == [0, 1, 2]
    for r in of("chunk_stored") + of("chunk_received"):
        assert r["upload_id"] == up.upload_id and r["total_chunks"] == 3 and r["checksum"]
    assert [r["chunk_index"] for r in of("chunk_duplicate")] == [0]
    assert [r["chunk_index"] for r in of("chunk_conflict")] == [0]
    # attempt: how many times this index has been sent (counted on its chunk row).
    for name in ("chunk_received", "chunk_validated"):
        sent = [(r["chunk_index"], r["attempt"]) for r in of(name)]
        assert sent == [(0, 1), (0, 2), (0, 3), (1, 1), (2, 1)], (name, sent)
    assert [(r["chunk_index"], r["attempt"]) for r in of("chunk_stored")] == [
        (0, 1),
        (1, 1),
        (2, 1),
    ]
    assert [r["attempt"] for r in of("chunk_duplicate")] == [2]
    assert [r["attempt"] for r in of("chunk_conflict")] == [3]
    transitions = [r["transition"] for r in of("upload_status_changed")]
    assert transitions == ["uploading → merging", "merging → completed"], transitions
    # The merge job runs under the correlation id of the PutChunk that started it.
    (locked,) = of("merge_lock_acquired")
    (completed,) = of("merge_completed")
    assert locked["fencing_token"] == completed["fencing_token"] > 0
    assert completed["upload_id"] == done.upload_id
    assert events.index("merge_lock_acquired") < events.index("merge_completed")
