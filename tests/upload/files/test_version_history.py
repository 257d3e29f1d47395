"""Version history (services/upload/files/history.py): ListVersions lists a file's content
versions newest first with number, size, checksum, author and time; Download reads any kept
version, byte ranges too; a version past retention is VERSION_PURGED, a number the file
never had VERSION_NOT_FOUND; viewers read the history, another tenant sees nothing.
SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import expect_error
from upload.version_helpers import new_file, new_version, read, restore, versions

from services.common.auth import Identity
from services.common.page_tokens import PageTokens
from services.upload.errors import VersionPurged
from services.upload.files.listing_cache import ListingCache
from services.upload.files.use_cases import Files
from services.upload.storage.blob_store import content_key
from services.upload.storage.lifecycle import ReclaimPolicy, reclaim

NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # The periodic sweep stays out of the way: the retention test runs `reclaim` itself.
    return {"reclaim_interval_seconds": 3600}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _history(cluster) -> tuple[str, bytes, bytes]:
    """alice's file: content v1, a rename (v2), a share with bob as editor (v3), bob's
    upload (v4). Returns the file id and the two contents."""
    alice, bob = cluster["alice"], cluster["bob"]
    first, second = os.urandom(3000), os.urandom(2000)
    made = await new_file(alice, first, "report.bin")
    file_id = made.file.file_id
    await alice.files.RenameFile(
        upload_pb2.RenameFileRequest(file_id=file_id, new_name="report-final.bin"),
        metadata=alice.metadata,
    )
    await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=file_id, user_id="bob", role=upload_pb2.ROLE_EDITOR),
        metadata=alice.metadata,
    )
    assert (await new_version(bob, file_id, second)).file.version == 4
    return file_id, first, second


async def test_versions_are_listed_newest_first_with_their_facts(cluster) -> None:
    alice = cluster["alice"]
    file_id, first, second = await _history(cluster)
    page = await versions(alice, file_id)
    assert page.file.version == 4 and page.file.name == "report-final.bin"
    assert page.next_page_token == ""
    got = [
        (v.version, v.size, v.checksum, v.author_user_id, v.current, v.kept) for v in page.versions
    ]
    assert got == [
        (4, len(second), sha(second), "bob", True, True),
        (1, len(first), sha(first), "alice", False, True),
    ]
    newer, older = page.versions
    assert older.created_at.seconds > 0
    assert newer.created_at.ToDatetime() >= older.created_at.ToDatetime()
    assert newer.checksum_algorithm == upload_pb2.CHECKSUM_ALGORITHM_SHA256
    # One a page: the token leads to the older one, and nothing after it.
    one = await versions(alice, file_id, page_size=1)
    assert [v.version for v in one.versions] == [4] and one.next_page_token
    rest = await versions(alice, file_id, page_size=1, page_token=one.next_page_token)
    assert [v.version for v in rest.versions] == [1] and rest.next_page_token == ""
    # A token of another file's history is refused.
    other = await new_file(alice, b"x", "other.bin")
    await expect_error(
        versions(alice, other.file.file_id, page_token=one.next_page_token),
        INVALID,
        "INVALID_PAGE_TOKEN",
    )


async def test_download_reads_any_kept_version_and_byte_ranges(cluster) -> None:
    alice = cluster["alice"]
    file_id, first, second = await _history(cluster)
    data, trailing = await read(alice, file_id, version=1)
    assert data == first
    assert (trailing["x-checksum"], trailing["x-version"]) == (sha(first), "1")
    data, trailing = await read(alice, file_id)
    assert data == second and (trailing["x-checksum"], trailing["x-version"]) == (sha(second), "4")
    # Ranges: offset and length; a length past the end stops at the end.
    assert (await read(alice, file_id, version=1, offset=100, length=50))[0] == first[100:150]
    assert (await read(alice, file_id, version=1, offset=2990, length=50))[0] == first[2990:]
    assert (await read(alice, file_id, version=4, length=7))[0] == second[:7]
    assert (await read(alice, file_id, version=1, offset=len(first)))[0] == b""
    # Numbers that were metadata changes (2, 3) or never were (9) are not content versions.
    for number in (2, 3, 9):
        info = await expect_error(
            read(alice, file_id, version=number), NOT_FOUND, "VERSION_NOT_FOUND"
        )
        assert info.metadata["version"] == str(number)
    await expect_error(read(alice, file_id, version=-1), INVALID, "INVALID_ARGUMENT")
    await expect_error(read(alice, file_id, version=1, length=-1), INVALID, "INVALID_ARGUMENT")
    await expect_error(
        read(alice, file_id, version=1, offset=len(first) + 1), INVALID, "INVALID_ARGUMENT"
    )


async def test_viewers_read_the_history_and_another_tenant_sees_nothing(cluster) -> None:
    alice, carol, mallory = cluster["alice"], cluster["carol"], cluster["mallory"]
    file_id, first, _ = await _history(cluster)
    await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=file_id, user_id="carol", role=upload_pb2.ROLE_VIEWER),
        metadata=alice.metadata,
    )
    seen = await versions(carol, file_id)
    assert [v.version for v in seen.versions] == [4, 1]
    assert seen.file.role == upload_pb2.ROLE_VIEWER
    assert (await read(carol, file_id, version=1))[0] == first
    # Another tenant: the same answer as for an id that does not exist, for every call.
    for call in (
        versions(mallory, file_id),
        read(mallory, file_id, version=1),
        restore(mallory, file_id, 1),
        versions(mallory, "no-such-file"),
    ):
        await expect_error(call, NOT_FOUND, "FILE_NOT_FOUND")
    # A folder has no versions.
    folder = await alice.files.CreateFolder(
        upload_pb2.CreateFolderRequest(name="docs"), metadata=alice.metadata
    )
    await expect_error(versions(alice, folder.file_id), PRECONDITION, "WRONG_FILE_KIND")


async def test_a_version_past_retention_is_purged_not_missing(cluster, sessions) -> None:
    """The retention sweep deletes superseded content outside the newest keep_count (and
    older than keep_days); the entry stays, marked not kept, and reading or restoring it is
    FAILED_PRECONDITION / VERSION_PURGED. The kept ones still read."""
    alice = cluster["alice"]
    contents = [os.urandom(1000 + i) for i in range(3)]
    file_id = (await new_file(alice, contents[0], "kept.bin")).file.file_id
    for data in contents[1:]:
        await new_version(alice, file_id, data)
    result = await reclaim(
        sessions, cluster.blobs, ReclaimPolicy(version_keep_count=2, version_keep_days=0)
    )
    assert result.bytes["old_version"] == len(contents[0])
    page = await versions(alice, file_id)
    assert [(v.version, v.kept, v.current) for v in page.versions] == [
        (3, True, True),
        (2, True, False),
        (1, False, False),
    ]
    assert (await read(alice, file_id, version=2))[0] == contents[1]
    info = await expect_error(read(alice, file_id, version=1), PRECONDITION, "VERSION_PURGED")
    assert info.metadata["version"] == "1" and info.metadata["purged_at"]
    await expect_error(restore(alice, file_id, 1), PRECONDITION, "VERSION_PURGED")
    # Its bytes are gone; the current and the kept one are there.
    keys = sorted([o.key async for o in cluster.blobs.list_objects(f"files/{file_id}")])
    assert keys == sorted(content_key(file_id, v.upload_id) for v in page.versions[:2])


async def test_an_old_version_deleted_before_its_download_opens_is_purged(
    cluster, sessions
) -> None:
    """The race with the sweep, made deterministic: the download resolved version 1 (kept
    then), the sweep deleted its bytes before the first was read: VERSION_PURGED, the
    answer a fresh Download of it gives (not CONTENT_REPLACED: "download again" would not
    help)."""
    alice = cluster["alice"]
    file_id = (await new_file(alice, os.urandom(1500), "gone.bin")).file.file_id
    await new_version(alice, file_id, os.urandom(1400))
    files = Files(sessions, cluster.blobs, ListingCache(10), PageTokens("t" * 32))
    identity = Identity(tenant_id="acme", user_id="alice")
    _, blocks = await files.open_download(
        identity, upload_pb2.DownloadRequest(file_id=file_id, version=1)
    )
    await reclaim(sessions, cluster.blobs, ReclaimPolicy(version_keep_count=1, version_keep_days=0))
    with pytest.raises(VersionPurged):
        async for _ in blocks:
            pass
    await expect_error(read(alice, file_id, version=1), PRECONDITION, "VERSION_PURGED")
