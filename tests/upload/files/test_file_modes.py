"""Blobs and databases are private to the service's user (issue 11, item 13): every file
0600 and every folder 0700, even under a permissive umask, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import (
    chunk_request,
    create_request,
    put_chunks,
    split,
    wait_chunks_purged,
    wait_status,
)

from services.upload.storage.blob_store import LocalBlobStore

CHUNK = 1024


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The common 022 umask: without explicit modes files would be 0644, folders 0755."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _assert_private(root: Path) -> list[Path]:
    seen = []
    for path in [root, *root.rglob("*")]:
        want = 0o700 if path.is_dir() else 0o600
        assert _mode(path) == want, f"{path} is {oct(_mode(path))}, want {oct(want)}"
        seen.append(path)
    return seen


async def test_blobs_and_database_files_are_private(cluster, sessions, database_url: str) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 2 + 3)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    # Leave one upload half done, so its chunk files are still on disk.
    partial = await alice.uploads.CreateUpload(
        create_request(data, CHUNK, name="partial"), metadata=alice.metadata
    )
    await alice.uploads.PutChunk(
        chunk_request(partial.upload_id, 0, data[:CHUNK]), metadata=alice.metadata
    )
    await put_chunks(alice, upload.upload_id, split(data, CHUNK))
    await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    # The commit's purge job deletes the completed upload's chunk folder: walk the tree
    # after it, not while it runs (a folder gone mid-walk is not a mode to check).
    await wait_chunks_purged(sessions, upload.upload_id, "the commit's purge job")

    blobs = _assert_private(cluster.settings.blob_root)
    names = {p.relative_to(cluster.settings.blob_root).parts[0] for p in blobs[1:]}
    assert {"uploads", "files"} <= names, names
    assert any(p.is_file() and "files" in p.parts for p in blobs), "no merged file checked"
    assert _mode(cluster.settings.data_dir) == 0o700
    if database_url.startswith("sqlite"):
        db = Path(database_url.split(":///", 1)[1])
        side_files = [Path(f"{db}{s}") for s in ("", "-wal", "-shm")]
        assert all(p.exists() for p in side_files), side_files
        for path in side_files:
            assert _mode(path) == 0o600, f"{path} is {oct(_mode(path))}"


async def test_staged_temp_files_are_private(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "a" / "b" / "blobs")
    staged = Path(str(await store.stage("uploads/u1/0", b"secret")))
    assert _mode(staged) == 0o600
    for folder in (tmp_path / "a", tmp_path / "a" / "b", store.root, staged.parent):
        assert _mode(folder) == 0o700, folder
    await store.publish(str(staged), "uploads/u1/0")
    assert _mode(store.path("uploads/u1/0")) == 0o600
