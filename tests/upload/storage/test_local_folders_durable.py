"""The local store makes a new folder's entry durable in its parent before a write into it
returns: a file fsynced in a folder whose own entry is not could vanish with it on a crash.
Each parent is fsynced once per folder, again when the folder is made anew; the root's own
entry, and those of the folders made for it, when the store starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import merge_core
from services.upload.storage.blob_store import ChunkRef, LocalBlobStore


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths fsynced, in order (the real fsyncs still run): Python's, and those
    merge_core.put_file makes in Rust, in its documented order (the staged file, the
    object's folder, then the folders it is given)."""
    paths: list[str] = []
    real = os.fsync
    real_put_file = merge_core.put_file

    def fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    def put_file(path, staged, data, fsync=True, folders=None) -> None:  # type: ignore[no-untyped-def]
        real_put_file(path, staged, data, fsync, folders)
        if fsync:
            paths.extend([str(staged), str(Path(path).parent), *map(str, folders or ())])

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(merge_core, "put_file", put_file)
    return paths


def test_the_roots_entry_and_those_of_folders_made_for_it_are_fsynced_at_start(
    tmp_path: Path, fsynced: list[str]
) -> None:
    LocalBlobStore(tmp_path / "data" / "blobs")
    # blobs/ made in data/, data/ made in tmp_path.
    assert fsynced == [str(tmp_path / "data"), str(tmp_path)]
    fsynced.clear()
    LocalBlobStore(tmp_path / "data" / "blobs")  # there already: its entry once more
    assert fsynced == [str(tmp_path / "data")]
    fsynced.clear()
    LocalBlobStore(tmp_path / "unsynced", fsync=False)
    assert fsynced == []


async def test_a_new_folders_entry_is_fsynced_in_its_parent_before_put_returns(
    tmp_path: Path, fsynced: list[str]
) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    root = str(store.root)
    fsynced.clear()  # the root's entry, at start
    await store.put("files/f1/v1", b"one")
    folder = f"{root}/files/f1"
    # The bytes (under their temp name), the name in f1, then f1's entry in files/ and
    # files/'s in the root.
    assert fsynced[0].startswith(f"{folder}/.v1.")
    assert fsynced[1:] == [folder, f"{root}/files", root]
    assert await store.read("files/f1/v1") == b"one"

    fsynced.clear()
    await store.put("files/f1/v2", b"two")
    # A folder already durable in its parent: no parent fsync again.
    assert fsynced[0].startswith(f"{folder}/.v2.") and fsynced[1:] == [folder]


async def test_a_folder_made_again_after_its_deletion_is_fsynced_again(
    tmp_path: Path, fsynced: list[str]
) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    root = str(store.root)
    fsynced.clear()  # the root's entry, at start
    await store.put("uploads/u1/0", b"chunk")
    assert await store.delete_prefix("uploads/u1") == 1
    fsynced.clear()
    await store.put("uploads/u1/0", b"chunk again")
    assert fsynced[1:] == [f"{root}/uploads/u1", f"{root}/uploads"]  # u1's new entry too


async def test_a_merged_files_new_folder_is_fsynced_in_its_parent(
    tmp_path: Path, fsynced: list[str]
) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    root = str(store.root)
    data = b"merged bytes"
    staged = await store.stage("uploads/u2/0", data)
    await store.publish(staged, "uploads/u2/0")
    hasher = merge_core.Hasher("sha256")
    hasher.update(data)
    checksum = hasher.hexdigest()
    fsynced.clear()
    chunk = ChunkRef(0, "uploads/u2/0", len(data), checksum)
    await store.merge([chunk], "files/f2/u2", "sha256", checksum)
    # merge_core fsyncs the file and f2; the store then f2's entry and files/'s.
    assert fsynced == [f"{root}/files", root]
    assert await store.read("files/f2/u2") == data
