"""A full disk (issue 11, item 9): ENOSPC while staging a chunk, and SQLite's "database or
disk is full", answer RESOURCE_EXHAUSTED / STORAGE_FULL; the temp file is removed, nothing is
recorded, and once there is room again the service carries on. On a real 1 MiB tmpfs."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.services import running_app
from upload.conftest import upload_settings
from upload.upload_helpers import chunk_request, create_request, expect_error, split, wait_status

from services.common.jobs import RuntimeOptions
from services.upload.app import build_app
from services.upload.sync.settings import SyncSettings

CHUNK = 256 * 1024
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards (needs root: skipped, saying so, without it)."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def _fill(fs: Path, leave: int) -> Path:
    """A filler file taking all but about `leave` bytes of `fs`."""
    stat = os.statvfs(fs)
    free = stat.f_bavail * stat.f_frsize
    filler = fs / "filler"
    with open(filler, "wb") as f:
        with contextlib.suppress(OSError):
            f.write(b"\0" * max(0, free - leave))
    return filler


def _litter(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


@pytest.fixture
def settings_overrides(tiny_fs: Path) -> dict[str, Any]:
    return {"blob_dir": tiny_fs / "blobs", "min_chunk_size": 1024}


async def test_enospc_while_staging_a_chunk(cluster, tiny_fs: Path) -> None:
    alice = cluster["alice"]
    data = os.urandom(2 * CHUNK)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    parts = split(data, CHUNK)
    await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 0, parts[0]), metadata=alice.metadata
    )
    filler = _fill(tiny_fs, leave=CHUNK // 2)
    for _ in range(2):  # and again: a full disk stays a clean refusal
        await expect_error(
            alice.uploads.PutChunk(
                chunk_request(upload.upload_id, 1, parts[1]), metadata=alice.metadata
            ),
            RE,
            "STORAGE_FULL",
        )
    assert _litter(tiny_fs / "blobs") == []
    state = await alice.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
    )
    assert state.received_chunk_count == 1
    assert state.status == upload_pb2.UPLOAD_STATUS_UPLOADING
    # Room again: the same chunk is stored and the upload completes.
    filler.unlink()
    await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 1, parts[1]), metadata=alice.metadata
    )
    done = await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    assert done.file_version == 1


async def test_sqlite_database_or_disk_is_full(
    tiny_fs: Path, tmp_path: Path, locks_address: str
) -> None:
    database_url = f"sqlite+aiosqlite:///{tiny_fs / 'upload.db'}"
    settings = upload_settings(
        database_url, tmp_path, locks_address, blob_dir=tmp_path / "blobs", blob_fsync=False
    )
    runtime = RuntimeOptions(
        node_id=f"t-{uuid.uuid4().hex[:6]}", concurrency=1, poll_interval=0.05, lease_seconds=10
    )
    app = build_app(settings, runtime, SyncSettings(webhook_port=0, enabled=False))
    async with running_app(app) as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.app.bound_port}") as channel:
            stub = upload_pb2_grpc.UploadServiceStub(channel)
            md = (("authorization", "Bearer dev-alice"),)
            await stub.CreateUpload(create_request(b"x", 1024, name="before"), metadata=md)
            filler = _fill(tiny_fs, leave=0)
            refused = 0
            for i in range(50):  # SQLite may still fit a few rows in pages it already has
                try:
                    await stub.CreateUpload(
                        create_request(b"y" * 5000, 1024, name=f"n{i}" * 40), metadata=md
                    )
                except grpc.aio.AioRpcError as exc:
                    await expect_error(_raise(exc), RE, "STORAGE_FULL")
                    refused += 1
                    break
            assert refused, "the database never filled up"
            filler.unlink()
            created = await stub.CreateUpload(create_request(b"z", 1024, name="after"), metadata=md)
            assert created.upload_id


async def _raise(exc: BaseException) -> None:
    raise exc
