"""Both blob stores keep the same guarantees: atomic chunk writes, range reads, and a
merge that verifies every chunk and the whole file while streaming and leaves no object
behind when anything fails. The S3 store runs against a real S3-compatible server."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

import merge_core
from services.upload.errors import BlobStoreUnavailable
from services.upload.settings import UploadSettings
from services.upload.storage.blob_store import (
    BlobStore,
    ChunkRef,
    LocalBlobStore,
    chunk_key,
    open_blob_store,
)
from services.upload.storage.blob_store.s3 import S3BlobStore

MIB = 1024 * 1024


def digest(data: bytes, algorithm: str = "sha256") -> str:
    hasher = merge_core.Hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def settings_for(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> UploadSettings:
    values: dict[str, Any] = {"data_dir": tmp_path / "data", "blob_fsync": False}
    if kind == "s3":
        values.update(request.getfixturevalue("s3").upload_settings())
        # The smallest part S3 allows, so a few MiB already make a multipart upload.
        values["s3_part_size"] = 5 * MIB
    return UploadSettings(**values)


@pytest.fixture(params=["local", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BlobStore]:
    """A fresh store of each kind (S3: a fresh prefix on the session's server)."""
    opened = open_blob_store(settings_for(request.param, tmp_path, request))
    yield opened
    await opened.close()


async def put_chunks(store: BlobStore, upload_id: str, parts: list[bytes]) -> list[ChunkRef]:
    refs = []
    for i, part in enumerate(parts):
        key = chunk_key(upload_id, i)
        staged = await store.stage(key, part)
        await store.publish(staged, key)
        await store.discard(staged)
        refs.append(ChunkRef(i, key, len(part), digest(part)))
    return refs


async def test_open_blob_store_follows_the_url(tmp_path: Path, s3: Any) -> None:
    local = open_blob_store(UploadSettings(blob_url=f"file://{tmp_path}/b"))
    assert isinstance(local, LocalBlobStore) and local.root == tmp_path / "b"
    remote = open_blob_store(UploadSettings(**s3.upload_settings("p")))
    assert type(remote).__name__ == "S3BlobStore"
    with pytest.raises(ValueError, match="blob_url"):
        UploadSettings(blob_url="ftp://x/y")
    with pytest.raises(ValueError, match="blob_url"):
        UploadSettings(blob_url="s3:///no-bucket")


async def test_staged_bytes_are_invisible_until_published(store: BlobStore) -> None:
    key = chunk_key("u-stage", 0)
    staged = await store.stage(key, b"abc")
    assert not await store.exists(key)
    await store.publish(staged, key)
    await store.discard(staged)
    assert await store.exists(key) and await store.size(key) == 3
    replaced = await store.stage(key, b"xyz!")
    await store.publish(replaced, key)
    assert await store.read(key) == b"xyz!"
    dropped = await store.stage(key, b"never")
    await store.discard(dropped)
    assert await store.read(key) == b"xyz!"


async def test_stage_checked_keeps_only_bytes_with_the_expected_digest(store: BlobStore) -> None:
    key = chunk_key("u-checked", 0)
    data = os.urandom(MIB + 3)
    for algorithm in merge_core.ALGORITHMS:
        refused, actual = await store.stage_checked(key, data, algorithm, "0" * 8)
        assert (refused, actual) == (None, digest(data, algorithm))
        assert not [o async for o in store.list_objects("uploads/u-checked")]
    staged, actual = await store.stage_checked(key, data, "sha256", digest(data))
    assert staged is not None and actual == digest(data)
    assert not await store.exists(key)
    await store.publish(staged, key)
    await store.discard(staged)
    assert await store.read(key) == data
    listed = [o async for o in store.list_objects("uploads/u-checked")]
    assert [(o.key, o.size, o.temporary) for o in listed] == [(key, len(data), False)]


async def test_range_reads_in_bounded_blocks(store: BlobStore) -> None:
    data = os.urandom(3 * MIB + 17)
    await put_chunks(store, "u-range", [data])
    key = chunk_key("u-range", 0)
    assert await store.read(key, 5, 10) == data[5:15]
    blocks = [b async for b in store.iter_read(key, 1000, MIB)]
    assert all(len(b) <= MIB for b in blocks)
    assert b"".join(blocks) == data[1000:]
    assert [b async for b in store.iter_read(key, len(data), MIB)] == []
    assert await store.checksum(key, "blake3") == digest(data, "blake3")


async def test_copy_makes_a_whole_independent_object(store: BlobStore) -> None:
    """RestoreVersion's copy: the new key holds every byte, listed as no temp file, and
    outlives its source; a missing source is FileNotFoundError and leaves nothing."""
    data = os.urandom(2 * MIB + 5)
    await put_chunks(store, "u-copy", [data])
    await store.copy(chunk_key("u-copy", 0), "files/f-copy/u-new")
    await store.delete(chunk_key("u-copy", 0))
    assert await store.read("files/f-copy/u-new") == data
    listed = [o async for o in store.list_objects("files/f-copy")]
    assert [(o.key, o.size, o.temporary) for o in listed] == [
        ("files/f-copy/u-new", len(data), False)
    ]
    with pytest.raises(FileNotFoundError):
        await store.copy(chunk_key("u-copy", 0), "files/f-copy/u-other")
    assert not await store.exists("files/f-copy/u-other")
    assert [o.key async for o in store.list_objects("files/f-copy")] == ["files/f-copy/u-new"]


async def test_s3_copies_past_one_copy_object_by_streaming(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Above S3's CopyObject limit (lowered here) the copy streams through a multipart
    upload: the same bytes arrive."""
    store = open_blob_store(settings_for("s3", tmp_path, request))
    try:
        assert isinstance(store, S3BlobStore)
        store.copy_object_max = MIB
        data = os.urandom(11 * MIB + 3)  # three parts of 5 MiB
        await put_chunks(store, "u-big", [data])
        await store.copy(chunk_key("u-big", 0), "files/f-big/u-new")
        assert await store.checksum("files/f-big/u-new", "sha256") == digest(data)
    finally:
        await store.close()


async def test_delete_prefix_removes_one_uploads_chunks(store: BlobStore) -> None:
    await put_chunks(store, "u-del", [b"a", b"b", b"c"])
    await put_chunks(store, "u-keep", [b"d"])
    assert await store.delete_prefix("uploads/u-del") == 3
    assert not await store.exists(chunk_key("u-del", 0))
    assert await store.exists(chunk_key("u-keep", 0))
    assert await store.delete_prefix("uploads/u-del") == 0
    await store.delete(chunk_key("u-keep", 0))
    await store.delete(chunk_key("u-keep", 0))
    assert not await store.exists(chunk_key("u-keep", 0))


async def test_concurrent_deletes_of_one_prefix_both_finish_and_leave_nothing(
    store: BlobStore,
) -> None:
    # Two sweeps (two replicas', or the service's and the admin tool's) removing the same
    # upload's chunks at once: neither fails on what the other removed first. Many small
    # uploads, each swept twice at once, so that one sweep's removal lands inside the
    # other's walk.
    uploads = [f"u-race-{n}" for n in range(150)]
    await asyncio.gather(*(store.put(chunk_key(u, i), b"x") for u in uploads for i in range(2)))
    counts = await asyncio.gather(
        *(store.delete_prefix(f"uploads/{u}") for u in uploads for _ in range(2))
    )
    for u in uploads:
        assert [o async for o in store.list_objects(f"uploads/{u}")] == []
    assert sum(counts) >= 2 * len(uploads), counts


async def test_a_listing_during_deletes_lists_what_is_left_and_does_not_fail(
    store: BlobStore,
) -> None:
    # The reclaim sweep lists a tree while another job deletes uploads' folders in it.
    uploads = [f"u-list-{n}" for n in range(150)]
    keys = {chunk_key(u, i) for u in uploads for i in range(2)}
    await asyncio.gather(*(store.put(key, b"x") for key in keys))

    async def listing() -> set[str]:
        return {o.key async for o in store.list_objects("uploads")}

    results = await asyncio.gather(
        *(listing() for _ in range(4)), *(store.delete_prefix(f"uploads/{u}") for u in uploads)
    )
    for listed in results[:4]:
        assert isinstance(listed, set) and listed <= keys
    assert await listing() == set()


async def test_merge_spanning_several_parts_is_verified(store: BlobStore) -> None:
    parts = [os.urandom(n) for n in (3 * MIB, 4 * MIB + 5, 1, 2 * MIB)]
    whole = b"".join(parts)
    refs = await put_chunks(store, "u-merge", parts)
    merged = await store.merge(refs[::-1], "files/f/u-merge", "sha256", digest(whole))
    assert (merged.size, merged.checksum, merged.chunk_count) == (len(whole), digest(whole), 4)
    assert await store.read("files/f/u-merge") == whole


async def test_merge_of_no_chunks_is_an_empty_file(store: BlobStore) -> None:
    merged = await store.merge([], "files/f/empty", "sha256", None)
    assert merged.size == 0 and await store.read("files/f/empty") == b""


@pytest.mark.parametrize("corrupt_index", [0, 2])
async def test_a_corrupt_chunk_fails_the_merge_and_leaves_no_object(
    store: BlobStore, corrupt_index: int
) -> None:
    parts = [os.urandom(3 * MIB) for _ in range(3)]
    refs = await put_chunks(store, "u-corrupt", parts)
    # The stored bytes change after their row was recorded (bit rot, a bad disk).
    key = refs[corrupt_index].key
    flipped = bytearray(parts[corrupt_index])
    flipped[123] ^= 1
    await store.publish(await store.stage(key, bytes(flipped)), key)
    with pytest.raises(merge_core.ChunkChecksumMismatch) as caught:
        await store.merge(refs, "files/f/u-corrupt", "sha256", None)
    assert caught.value.index == corrupt_index
    assert not await store.exists("files/f/u-corrupt")


async def test_a_wrong_size_or_whole_file_checksum_leaves_no_object(store: BlobStore) -> None:
    parts = [os.urandom(3 * MIB), os.urandom(3 * MIB)]
    refs = await put_chunks(store, "u-size", parts)
    lying = [refs[0], ChunkRef(1, refs[1].key, refs[1].size - 1, refs[1].checksum)]
    with pytest.raises(merge_core.ChunkSizeMismatch):
        await store.merge(lying, "files/f/u-size", "sha256", None)
    assert not await store.exists("files/f/u-size")
    with pytest.raises(merge_core.FileChecksumMismatch):
        await store.merge(refs, "files/f/u-size", "sha256", digest(b"other"))
    assert not await store.exists("files/f/u-size")


async def test_a_stored_object_of_the_wrong_size_is_named(store: BlobStore) -> None:
    parts = [os.urandom(1000), os.urandom(1000), os.urandom(1000)]
    refs = await put_chunks(store, "u-grown", parts)
    # Chunk 1's object grew after its row was recorded: refused by size, whatever its bytes.
    key = refs[1].key
    await store.publish(await store.stage(key, parts[1] + os.urandom(5000)), key)
    with pytest.raises(merge_core.ChunkSizeMismatch) as caught:
        await store.merge(refs, "files/f/u-grown", "sha256", None)
    err = caught.value
    assert (err.index, err.expected, err.actual) == (1, 1000, 6000)
    assert str(err.path).endswith(key)
    assert not await store.exists("files/f/u-grown")


async def test_missing_indexes_are_refused_before_any_read(store: BlobStore) -> None:
    refs = await put_chunks(store, "u-gap", [b"a", b"b", b"c"])
    with pytest.raises(merge_core.MissingChunk):
        await store.merge([refs[0], refs[2]], "files/f/u-gap", "sha256", None)
    with pytest.raises(merge_core.DuplicateChunk):
        await store.merge([*refs, refs[1]], "files/f/u-gap", "sha256", None)
    assert not await store.exists("files/f/u-gap")


async def test_the_fixture_lists_what_the_store_holds(s3: Any) -> None:
    prefix = "t-keys"
    store = open_blob_store(UploadSettings(**s3.upload_settings(prefix)))
    await put_chunks(store, "u-keys", [b"a", b"b"])
    refs = await put_chunks(store, "u-keys2", [b"c"])
    await store.merge(refs, "files/f/u-keys2", "sha256", None)
    assert s3.keys(prefix) == [
        f"{prefix}/files/f/u-keys2",
        f"{prefix}/uploads/u-keys/0",
        f"{prefix}/uploads/u-keys/1",
        f"{prefix}/uploads/u-keys2/0",
    ]
    assert s3.object_path(f"{prefix}/uploads/u-keys/1").read_bytes() == b"b"


async def test_a_missing_chunk_object_is_a_retryable_store_error(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = open_blob_store(settings_for("s3", tmp_path, request))
    refs = await put_chunks(store, "u-lost", [b"a", b"b"])
    await store.delete(refs[1].key)
    with pytest.raises(BlobStoreUnavailable, match="missing"):
        await store.merge(refs, "files/f/u-lost", "sha256", None)
    assert not await store.exists("files/f/u-lost")


async def test_an_unreachable_server_is_blob_store_unavailable(
    tmp_path: Path, s3_factory: Any
) -> None:
    server = s3_factory()
    store = open_blob_store(UploadSettings(**server.upload_settings()))
    await store.publish(await store.stage("k", b"x"), "k")
    server.stop()
    before = REGISTRY.get_sample_value(
        "serentak_upload_blob_store_errors_total", {"operation": "put"}
    )
    with pytest.raises(BlobStoreUnavailable) as caught:
        await store.publish(await store.stage("k", b"y"), "k")
    assert caught.value.reason == "BLOB_STORE_UNAVAILABLE"
    assert (
        REGISTRY.get_sample_value("serentak_upload_blob_store_errors_total", {"operation": "put"})
        == (before or 0) + 1
    )
    server.start()
    assert await store.read("k") == b"x"


def test_a_local_key_that_would_leave_the_root_is_refused(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    assert store.path("files/f1/u1") == (tmp_path / "blobs" / "files" / "f1" / "u1").resolve()
    for key in ("../outside", "files/../../outside", "/etc/passwd", "..", ""):
        with pytest.raises(ValueError, match="escapes the store"):
            store.path(key)
