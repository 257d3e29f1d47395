"""RestoreVersion (services/upload/merge/restore_version.py): a kept older version becomes
the file's next version, its bytes copied to a key of its own, committed under the file
lock with the fencing check and announced once, like any upload. Only editors restore;
racing uploads and restores of one file each commit once, in strictly increasing versions.
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from upload.upload_helpers import expect_error, put_chunks, split, wait_status
from upload.version_helpers import (
    content_events,
    new_file,
    new_version,
    read,
    restore,
    versions,
)

from services.upload.audit import UploadAudit
from services.upload.files.versions import commit_fenced
from services.upload.models import COMPLETED, FileRow, UploadRow
from services.upload.storage.blob_store import content_key
from services.upload.storage.lifecycle import ReclaimPolicy, reclaim

PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # The periodic sweep stays out of the way: tests run `reclaim` themselves.
    return {"reclaim_interval_seconds": 3600}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _keys(cluster, file_id: str) -> list[str]:
    return sorted([o.key async for o in cluster.blobs.list_objects(f"files/{file_id}")])


async def _two_versions(client) -> tuple[str, bytes, bytes, list[str]]:
    """A file with content v1 and v2; its id, both contents and both upload ids."""
    first, second = os.urandom(5000), os.urandom(4000)
    made = await new_file(client, first, "doc.bin")
    again = await new_version(client, made.file.file_id, second)
    return made.file.file_id, first, second, [made.upload.upload_id, again.upload.upload_id]


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_a_restore_is_a_new_version_with_its_own_bytes_announced_once(
    cluster, sessions
) -> None:
    alice = cluster["alice"]
    file_id, first, second, uploads = await _two_versions(alice)
    done = await restore(alice, file_id, 1)
    assert (done.file.version, done.restored_from) == (3, 1)
    assert (done.file.size, done.file.checksum) == (len(first), sha(first))
    assert (done.version.version, done.version.author_user_id) == (3, "alice")
    assert done.version.current and done.version.kept
    assert (await read(alice, file_id))[0] == first
    page = await versions(alice, file_id)
    assert [(v.version, v.current, v.checksum) for v in page.versions] == [
        (3, True, sha(first)),
        (2, False, sha(second)),
        (1, False, sha(first)),
    ]
    # Announced like any commit: one file.content.updated for version 3, naming the new
    # version's upload, the restorer its actor.
    events = await content_events(cluster.settings.database_url, file_id)
    assert [(e.version, e.file_content_updated.upload_id) for e in events] == [
        (1, uploads[0]),
        (2, uploads[1]),
        (3, done.version.upload_id),
    ]
    assert events[-1].actor_user_id == "alice"
    assert events[-1].file_content_updated.checksum == sha(first)
    # Its own bytes: a copy under the new version's key, v1's left as they were.
    new_key = content_key(file_id, done.version.upload_id)
    assert await _keys(cluster, file_id) == sorted(
        [*(content_key(file_id, u) for u in uploads), new_key]
    )
    # So retention treats it as any version: once v1 and v2 age out, the restored
    # version (current, sharing no blob with v1) still reads whole.
    await reclaim(sessions, cluster.blobs, ReclaimPolicy(version_keep_count=1, version_keep_days=0))
    assert await _keys(cluster, file_id) == [new_key]
    assert (await read(alice, file_id))[0] == first
    assert (await read(alice, file_id, version=3))[0] == first
    assert [v.kept for v in (await versions(alice, file_id)).versions] == [True, False, False]
    # The audit finds nothing wrong with a version that has no chunks: it says 0 of 0, and
    # its re-hash matches.
    audit = await UploadAudit(sessions, cluster.blobs, default_sample=100).run()
    assert done.version.upload_id not in {m.upload_id for m in audit.count_mismatches}
    checked = {c.file_id: c.ok for c in audit.checksum_checks}
    assert checked[file_id] is True


async def test_only_an_editor_restores(cluster) -> None:
    alice, bob, carol, mallory = (cluster[u] for u in ("alice", "bob", "carol", "mallory"))
    file_id, first, _, _ = await _two_versions(alice)
    for user, role in (("bob", upload_pb2.ROLE_VIEWER), ("carol", upload_pb2.ROLE_EDITOR)):
        await alice.files.ShareFile(
            upload_pb2.ShareFileRequest(file_id=file_id, user_id=user, role=role),
            metadata=alice.metadata,
        )
    # The viewer reads v1 but may not restore it; another tenant sees no file at all.
    assert (await read(bob, file_id, version=1))[0] == first
    await expect_error(
        restore(bob, file_id, 1), grpc.StatusCode.PERMISSION_DENIED, "INSUFFICIENT_ROLE"
    )
    await expect_error(restore(mallory, file_id, 1), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND")
    assert (
        await alice.files.GetFile(
            upload_pb2.GetFileRequest(file_id=file_id), metadata=alice.metadata
        )
    ).version == 4  # v1, v2, two shares: nothing restored
    done = await restore(carol, file_id, 1)
    assert (done.file.version, done.version.author_user_id) == (5, "carol")
    assert done.file.role == upload_pb2.ROLE_EDITOR
    events = await content_events(cluster.settings.database_url, file_id)
    assert (events[-1].version, events[-1].actor_user_id) == (5, "carol")
    assert {"alice", "bob", "carol"} <= set(events[-1].audience_user_ids)


async def test_refusals_leave_no_version_and_no_bytes(cluster, sessions) -> None:
    alice = cluster["alice"]
    file_id, _, _, uploads = await _two_versions(alice)
    kept = await _keys(cluster, file_id)
    await expect_error(restore(alice, file_id, 2), PRECONDITION, "VERSION_IS_CURRENT")
    await expect_error(restore(alice, file_id, 7), grpc.StatusCode.NOT_FOUND, "VERSION_NOT_FOUND")
    await expect_error(
        restore(alice, file_id, 0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
    )
    # Refused under the lock, after the copy was made: the copy is deleted again.
    await expect_error(
        restore(alice, file_id, 1, expected_version=1), grpc.StatusCode.ABORTED, "VERSION_MISMATCH"
    )
    await alice.files.DeleteFile(
        upload_pb2.DeleteFileRequest(file_id=file_id), metadata=alice.metadata
    )
    await expect_error(restore(alice, file_id, 1), PRECONDITION, "FILE_DELETED")
    assert await _keys(cluster, file_id) == kept
    async with sessions() as session:
        rows = (
            await session.execute(select(UploadRow.id).where(UploadRow.file_id == file_id))
        ).scalars()
        assert sorted(rows) == sorted(uploads)
    # Back from the trash, with the version it was at: the restore goes through.
    await alice.files.RestoreFile(
        upload_pb2.RestoreFileRequest(file_id=file_id), metadata=alice.metadata
    )
    done = await restore(alice, file_id, 1, expected_version=4)
    assert done.file.version == 5


async def test_a_stale_lock_token_cannot_commit_a_restore(cluster, sessions) -> None:
    """Invariant 7 on RestoreVersion: a newer lock holder committed (the file's
    last_lock_token is past any token this call can get); the commit is refused (ABORTED /
    STALE_FENCING_TOKEN) and leaves nothing: no upload, no version, no event, no bytes."""
    alice = cluster["alice"]
    file_id, _, _, uploads = await _two_versions(alice)
    newer = 10**15  # an etcd revision far ahead of this cluster's
    async with sessions.begin() as session:
        await commit_fenced(session, file_id, newer)
    await expect_error(restore(alice, file_id, 1), grpc.StatusCode.ABORTED, "STALE_FENCING_TOKEN")
    async with sessions() as session:
        file = await session.get(FileRow, file_id)
        assert file is not None and (file.version, file.last_lock_token) == (3, newer)
        rows = (
            await session.execute(select(UploadRow.id).where(UploadRow.file_id == file_id))
        ).scalars()
        assert sorted(rows) == sorted(uploads)
    assert len(await content_events(cluster.settings.database_url, file_id)) == 2
    assert await _keys(cluster, file_id) == sorted(content_key(file_id, u) for u in uploads)


async def test_a_retried_restore_makes_one_version(cluster) -> None:
    """One client_request_id, one restore: a retry (sequential or concurrent) answers with
    the version the first call made; the same id for another restore is refused."""
    alice = cluster["alice"]
    file_id, *_ = await _two_versions(alice)
    once = await restore(alice, file_id, 1, client_request_id="undo-1")
    again = await restore(alice, file_id, 1, client_request_id="undo-1")
    assert again.version.upload_id == once.version.upload_id
    assert again.file.version == once.file.version == 3
    racing = await asyncio.gather(
        *(restore(alice, file_id, 2, client_request_id="undo-2") for _ in range(4))
    )
    assert len({r.version.upload_id for r in racing}) == 1
    assert {r.file.version for r in racing} == {4}
    await expect_error(
        restore(alice, file_id, 2, client_request_id="undo-1"),
        grpc.StatusCode.ALREADY_EXISTS,
        "CLIENT_REQUEST_ID_REUSED",
    )
    assert [v.version for v in (await versions(alice, file_id)).versions] == [4, 3, 2, 1]
    assert len(await content_events(cluster.settings.database_url, file_id)) == 4


async def _merged_version(client, file_id: str, data: bytes) -> upload_pb2.Upload:
    """A chunked upload of the next version of `file_id`, merged by the job runtime."""
    upload = await client.uploads.CreateUpload(
        upload_pb2.CreateUploadRequest(
            file_id=file_id,
            total_chunks=len(split(data, 1024)),
            total_size=len(data),
            chunk_size=1024,
        ),
        metadata=client.metadata,
    )
    await put_chunks(client, upload.upload_id, split(data, 1024))
    return await wait_status(client, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)


@pytest.mark.slow
async def test_restores_racing_uploads_commit_each_once_in_order(cluster, sessions) -> None:
    """Restores, UploadFiles and a chunked upload's merge of one file, all at once, several
    rounds: every call commits exactly one version; the versions are distinct and strictly
    increase in commit order; each is announced once (one file.content.updated per version,
    naming its upload); no update is lost (the file's content is the highest version's,
    and every version reads back as the bytes that call committed)."""
    alice, bob = cluster["alice"], cluster["bob"]
    file_id, first, second, _ = await _two_versions(alice)
    await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=file_id, user_id="bob", role=upload_pb2.ROLE_EDITOR),
        metadata=alice.metadata,
    )
    third = os.urandom(3500)
    # v4, so v2 is no longer current when the rounds restore it.
    assert (await new_version(alice, file_id, third)).file.version == 4
    expected: dict[int, bytes] = {1: first, 2: second, 4: third}
    for round_ in range(4):
        payloads = [os.urandom(3000 + 17 * round_ + i) for i in range(3)]
        merged = os.urandom(3 * 1024 + round_)
        calls: list[Any] = [
            new_version(bob if i % 2 else alice, file_id, p) for i, p in enumerate(payloads)
        ]
        calls += [restore(alice, file_id, 1), restore(bob, file_id, 2), restore(bob, file_id, 1)]
        calls.append(_merged_version(alice, file_id, merged))
        results = await asyncio.gather(*calls)
        committed = [r.file.version for r in results[:-1]] + [results[-1].file_version]
        assert len(set(committed)) == len(committed), committed
        for version, data in zip(committed[:3], payloads, strict=True):
            expected[version] = data
        expected[committed[-1]] = merged
        for version, source in zip(committed[3:6], (1, 2, 1), strict=True):
            expected[version] = expected[source]
    page = await versions(alice, file_id, page_size=1000)
    listed = [v.version for v in page.versions]
    assert listed == sorted(expected, reverse=True)
    for entry in page.versions:
        assert entry.checksum == sha(expected[entry.version]), entry.version
    assert (await read(alice, file_id))[0] == expected[max(expected)]
    for version in (max(expected), min(v for v in expected if v > 2)):
        assert (await read(alice, file_id, version=version))[0] == expected[version]
    # Each version announced once, in increasing order, naming the upload that holds it.
    events = await content_events(cluster.settings.database_url, file_id)
    by_upload = {v.upload_id: v.version for v in page.versions}
    assert [e.version for e in events] == sorted(expected)
    assert {e.file_content_updated.upload_id: e.version for e in events} == by_upload
    async with sessions() as session:
        rows = (
            await session.execute(
                select(UploadRow.file_version).where(
                    UploadRow.file_id == file_id, UploadRow.status == COMPLETED
                )
            )
        ).scalars()
        assert sorted(rows) == sorted(expected)
