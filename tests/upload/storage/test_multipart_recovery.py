"""S3 multipart uploads are never orphaned (issue 34): a merge SIGKILLed after its first
part reached the S3 server (s3s-fs) leaves a recorded multipart upload; the restarted
service's re-run merge aborts it before writing its own, or the reclaim sweep aborts it
once past the grace. Either way no multipart upload is left, no part file on s3s-fs's
disk, no record in the database; and the re-run merge's bytes are exact.

The merge is stopped deterministically: one chunk object on s3s-fs's disk becomes a FIFO
with no writer, so the server's GET of it blocks opening it; the merge has by then sent
the parts before that chunk. The test waits for the first part file (observable), kills.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from support.s3 import S3Server
from upload.storage.test_blob_stores import digest, put_chunks
from upload.upload_helpers import chunk_request, create_request, split
from upload.upload_process import ALICE, kill, upload_env, upload_process, wait_completed, wait_for

import merge_core
from services.common.db import create_engine as create_async_engine
from services.common.db import session_factory, sync_url
from services.upload.database import migrate
from services.upload.settings import UploadSettings
from services.upload.storage.blob_store import open_blob_store
from services.upload.storage.lifecycle import ReclaimPolicy, reclaim

MIB = 1024 * 1024
CHUNK = MIB
PART = 5 * MIB  # the smallest part S3 allows: part 1 is chunks 0-4
STUCK = 8  # the chunk whose GET blocks: after part 1, before part 2


def _records(database_url: str) -> list[tuple[str, str]]:
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT object_key, upload_id FROM s3_multipart_uploads"))
            return [(r[0], r[1]) for r in rows]
    finally:
        engine.dispose()


def _unblock(fifo: Path, data: bytes) -> None:
    """Let s3s-fs's blocked open of the FIFO return (a writer comes and goes), then put
    the chunk's real bytes back."""
    with contextlib.suppress(OSError):  # ENXIO: no reader was waiting
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    fifo.unlink()
    fifo.write_bytes(data)


async def _kill_mid_merge(
    tmp_path: Path, env: dict[str, str], s3: S3Server, prefix: str, data: bytes
) -> str:
    """Upload `data` and SIGKILL the service once its merge has sent part 1 and blocks on
    chunk STUCK; returns the upload id (chunk STUCK restored, the record left)."""
    chunks = split(data, CHUNK)
    last = len(chunks) - 1
    async with upload_process(tmp_path, env) as (proc, stub):
        upload = await stub.CreateUpload(create_request(data, CHUNK), metadata=ALICE)
        for i, c in enumerate(chunks[:last]):
            await stub.PutChunk(chunk_request(upload.upload_id, i, c), metadata=ALICE)
        fifo = s3.object_path(f"{prefix}/uploads/{upload.upload_id}/{STUCK}")
        fifo.unlink()
        os.mkfifo(fifo, 0o600)
        await stub.PutChunk(chunk_request(upload.upload_id, last, chunks[last]), metadata=ALICE)
        await wait_for(
            lambda: any(".part-" in name for name in s3.multipart_state()),
            lambda: f"never saw part 1 on s3s-fs: {s3.multipart_state()}",
        )
        kill(proc)
    _unblock(fifo, chunks[STUCK])
    return str(upload.upload_id)


def _env(database_url: str, locks_address: str, s3: S3Server, prefix: str) -> dict[str, str]:
    return {
        **upload_env(database_url, locks_address, s3_part_size=str(PART)),
        **s3.env(prefix),
    }


async def test_a_rerun_merge_aborts_the_killed_merges_multipart_upload(
    database_url: str, tmp_path: Path, locks_address: str, s3_factory
) -> None:  # type: ignore[no-untyped-def]
    s3 = s3_factory()
    prefix = "rerun"
    env = _env(database_url, locks_address, s3, prefix)
    data = os.urandom(CHUNK * 12 + 10)
    upload_id = await _kill_mid_merge(tmp_path, env, s3, prefix, data)
    # What SIGKILL left: a multipart upload with its part on disk, and its record.
    (recorded,) = _records(database_url)
    assert recorded[0].endswith(f"/{upload_id}")
    assert any(recorded[1] in name and ".part-1" in name for name in s3.multipart_state())

    async with upload_process(tmp_path, env) as (proc, stub):
        done = await wait_completed(stub, upload_id)
        assert s3.object_path(f"{prefix}/files/{done.file_id}/{upload_id}").read_bytes() == data
        assert '"reason": "rerun"' in proc.log_text() or '"reason":"rerun"' in proc.log_text()
    assert s3.multipart_state() == []
    assert _records(database_url) == []


async def test_the_sweep_aborts_a_recorded_multipart_upload_past_the_grace(
    database_url: str, tmp_path: Path, locks_address: str, s3_factory
) -> None:  # type: ignore[no-untyped-def]
    s3 = s3_factory()
    prefix = "sweep"
    env = _env(database_url, locks_address, s3, prefix)
    await _kill_mid_merge(tmp_path, env, s3, prefix, os.urandom(CHUNK * 12 + 10))
    assert len(_records(database_url)) == 1 and s3.multipart_state()

    # The sweep alone (no merge re-runs here), on the same database and bucket.
    settings = UploadSettings(
        upload_database_url=database_url,
        data_dir=tmp_path / "data",
        **s3.upload_settings(prefix),  # type: ignore[arg-type]
    )
    engine = create_async_engine(database_url)
    blobs = open_blob_store(settings, session_factory(engine))
    try:
        # Within the grace: a merge may still be writing it, so it stays.
        await reclaim(session_factory(engine), blobs, ReclaimPolicy(temp_grace_seconds=3600))
        assert len(_records(database_url)) == 1 and s3.multipart_state()
        swept = await reclaim(session_factory(engine), blobs, ReclaimPolicy(temp_grace_seconds=0))
        assert swept.objects == 1
        assert s3.multipart_state() == []
        assert _records(database_url) == []
        # s3s-fs has no ListMultipartUploads (the second net): a later run still succeeds.
        again = await reclaim(session_factory(engine), blobs, ReclaimPolicy(temp_grace_seconds=0))
        assert again.objects == 0
    finally:
        await blobs.close()
        await engine.dispose()


async def test_a_failed_merge_aborts_its_multipart_upload_and_forgets_it(
    database_url: str, tmp_path: Path, s3_factory
) -> None:  # type: ignore[no-untyped-def]
    # Parts sent, then the whole file's checksum fails at the end of the stream.
    s3 = s3_factory()
    migrate(database_url)
    settings = UploadSettings(
        upload_database_url=database_url,
        data_dir=tmp_path / "data",
        s3_part_size=PART,
        **s3.upload_settings("failed"),  # type: ignore[arg-type]
    )
    engine = create_async_engine(database_url)
    blobs = open_blob_store(settings, session_factory(engine))
    try:
        parts = [os.urandom(3 * MIB) for _ in range(4)]
        refs = await put_chunks(blobs, "u-failed", parts)
        with pytest.raises(merge_core.FileChecksumMismatch):
            await blobs.merge(refs, "files/f/u-failed", "sha256", digest(b"other"))
        assert not await blobs.exists("files/f/u-failed")
        assert s3.multipart_state() == []
        assert _records(database_url) == []
    finally:
        await blobs.close()
        await engine.dispose()
