"""The local store makes a new folder's entry durable before anything is stored in it:
a file fsynced in a folder whose own entry is not could vanish with it on a crash. Each
parent is fsynced once per folder, again when the folder is made anew."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.upload.storage.blob_store import LocalBlobStore


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths fsynced, in order (the real fsync still runs)."""
    paths: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


async def test_a_new_folders_entry_is_fsynced_in_its_parent_before_its_file(
    tmp_path: Path, fsynced: list[str]
) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    root = str(store.root)
    await store.put("files/f1/v1", b"one")
    folder = f"{root}/files/f1"
    # f1's entry in files/ and files/ in the root, then the file's bytes (its temp name),
    # then its name in f1.
    assert sorted(fsynced[:2]) == [root, f"{root}/files"]
    assert fsynced[2].startswith(f"{folder}/.v1.") and fsynced[3:] == [folder]
    assert await store.read("files/f1/v1") == b"one"

    fsynced.clear()
    await store.put("files/f1/v2", b"two")
    # A folder already durable: no parent fsync again.
    assert fsynced[0].startswith(f"{folder}/.v2.") and fsynced[1:] == [folder]


async def test_a_folder_made_again_after_its_deletion_is_fsynced_again(
    tmp_path: Path, fsynced: list[str]
) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    root = str(store.root)
    await store.put("uploads/u1/0", b"chunk")
    assert await store.delete_prefix("uploads/u1") == 1
    fsynced.clear()
    await store.put("uploads/u1/0", b"chunk again")
    assert fsynced[0] == f"{root}/uploads"  # u1's new entry
