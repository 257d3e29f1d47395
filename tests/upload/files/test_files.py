"""FileService: versions + events per change, the versioned listing cache (invariant 11),
roles, tenant isolation, Download with its checksum in trailing metadata."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import (
    chunk_request,
    create_request,
    download,
    expect_error,
    sha256,
    upload_completed,
    wait_status,
)

CHUNK = 1024


async def _upload_file(client, data: bytes, name: str = "doc.bin", folder_id: str = "") -> str:
    done = await upload_completed(client, data, CHUNK, name=name, folder_id=folder_id)
    return done.file_id


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_download_and_new_version(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 2 + 5)
    file_id = await _upload_file(alice, data)
    body, trailing = await download(alice, file_id)
    assert body == data
    assert trailing["x-checksum"] == sha256(data) and trailing["x-checksum-algorithm"] == "sha256"
    tail, _ = await download(alice, file_id, offset=CHUNK)
    assert tail == data[CHUNK:]
    end, trailing = await download(alice, file_id, offset=len(data))
    assert end == b"" and trailing["x-checksum"] == sha256(data)
    # A new version of the same file.
    v2 = os.urandom(100)
    up = await alice.uploads.CreateUpload(
        upload_pb2.CreateUploadRequest(
            file_id=file_id, total_chunks=1, total_size=100, chunk_size=CHUNK
        ),
        metadata=alice.metadata,
    )
    await alice.uploads.PutChunk(chunk_request(up.upload_id, 0, v2), metadata=alice.metadata)
    done = await wait_status(alice, up.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    assert done.file_version == 2
    assert (await download(alice, file_id))[0] == v2


async def test_rename_is_never_served_stale_from_the_listing_cache(cluster) -> None:
    alice = cluster["alice"]
    folder = await alice.files.CreateFolder(
        upload_pb2.CreateFolderRequest(name="docs"), metadata=alice.metadata
    )
    file_id = await _upload_file(alice, b"hello", folder_id=folder.file_id)
    listing = upload_pb2.ListFolderRequest(folder_id=folder.file_id)
    for n in range(20):
        # Warm the cache, then rename; readers racing the rename may see old or new, but
        # after RenameFile returns, every listing shows the new name.
        await alice.files.ListFolder(listing, metadata=alice.metadata)
        readers = [alice.files.ListFolder(listing, metadata=alice.metadata) for _ in range(5)]
        renamed, *_ = await asyncio.gather(
            alice.files.RenameFile(
                upload_pb2.RenameFileRequest(file_id=file_id, new_name=f"name-{n}"),
                metadata=alice.metadata,
            ),
            *readers,
        )
        after = await alice.files.ListFolder(listing, metadata=alice.metadata)
        assert [f.name for f in after.files] == [f"name-{n}"]
        assert after.files[0].version == renamed.version
    await expect_error(
        alice.files.RenameFile(
            upload_pb2.RenameFileRequest(file_id=file_id, new_name="x", expected_version=1),
            metadata=alice.metadata,
        ),
        grpc.StatusCode.ABORTED,
        "VERSION_MISMATCH",
    )


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_roles_and_tenant_isolation(cluster) -> None:
    alice, bob, carol, mallory = (
        cluster["alice"],
        cluster["bob"],
        cluster["carol"],
        cluster["mallory"],
    )
    file_id = await _upload_file(alice, b"secret")
    get = upload_pb2.GetFileRequest(file_id=file_id)
    # Not shared yet: bob sees nothing; mallory (other tenant) sees nothing.
    await expect_error(
        bob.files.GetFile(get, metadata=bob.metadata), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"
    )
    await expect_error(
        mallory.files.GetFile(get, metadata=mallory.metadata),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    )
    shared = await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=file_id, user_id="bob", role=upload_pb2.ROLE_VIEWER),
        metadata=alice.metadata,
    )
    assert (await bob.files.GetFile(get, metadata=bob.metadata)).role == upload_pb2.ROLE_VIEWER
    await expect_error(
        bob.files.RenameFile(
            upload_pb2.RenameFileRequest(file_id=file_id, new_name="mine"), metadata=bob.metadata
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "INSUFFICIENT_ROLE",
    )
    await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(
            file_id=file_id,
            user_id="carol",
            role=upload_pb2.ROLE_EDITOR,
            expected_version=shared.version,
        ),
        metadata=alice.metadata,
    )
    renamed = await carol.files.RenameFile(
        upload_pb2.RenameFileRequest(file_id=file_id, new_name="edited"), metadata=carol.metadata
    )
    assert renamed.name == "edited"
    collaborators = await alice.files.ListCollaborators(
        upload_pb2.ListCollaboratorsRequest(file_id=file_id), metadata=alice.metadata
    )
    assert [(c.user_id, c.role) for c in collaborators.collaborators] == [
        ("bob", upload_pb2.ROLE_VIEWER),
        ("carol", upload_pb2.ROLE_EDITOR),
    ]
    await expect_error(
        mallory.files.Download(
            upload_pb2.DownloadRequest(file_id=file_id), metadata=mallory.metadata
        ).read(),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    )
    deleted = await alice.files.DeleteFile(
        upload_pb2.DeleteFileRequest(file_id=file_id), metadata=alice.metadata
    )
    assert deleted.deleted
    restored = await alice.files.RestoreFile(
        upload_pb2.RestoreFileRequest(file_id=file_id), metadata=alice.metadata
    )
    assert not restored.deleted and restored.version == deleted.version + 1


async def test_bad_input_gets_its_code_and_reason(cluster) -> None:
    alice, mallory = cluster["alice"], cluster["mallory"]
    md = alice.metadata
    u = alice.uploads
    cases = [
        (
            u.CreateUpload(
                upload_pb2.CreateUploadRequest(total_chunks=1, total_size=1, chunk_size=CHUNK),
                metadata=md,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            u.CreateUpload(create_request(b"x", CHUNK, name=""), metadata=md),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_NAME",
        ),
        (
            u.CreateUpload(
                upload_pb2.CreateUploadRequest(
                    new_file=upload_pb2.NewFileTarget(name="a"),
                    total_chunks=0,
                    total_size=0,
                    chunk_size=CHUNK,
                ),
                metadata=md,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            u.CreateUpload(
                upload_pb2.CreateUploadRequest(
                    new_file=upload_pb2.NewFileTarget(name="a"),
                    total_chunks=2,
                    total_size=CHUNK * 3,
                    chunk_size=CHUNK,
                ),
                metadata=md,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            u.CreateUpload(create_request(b"x", CHUNK, checksum_algorithm=99), metadata=md),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            u.CreateUpload(create_request(b"x", CHUNK, expected_checksum="zz"), metadata=md),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_CHECKSUM",
        ),
        (
            u.CreateUpload(
                upload_pb2.CreateUploadRequest(
                    file_id="nope", total_chunks=1, total_size=1, chunk_size=CHUNK
                ),
                metadata=md,
            ),
            grpc.StatusCode.NOT_FOUND,
            "FILE_NOT_FOUND",
        ),
        (
            u.GetUpload(upload_pb2.GetUploadRequest(upload_id="nope"), metadata=md),
            grpc.StatusCode.NOT_FOUND,
            "UPLOAD_NOT_FOUND",
        ),
        (
            u.GetUpload(upload_pb2.GetUploadRequest(), metadata=md),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (
            u.GetUpload(upload_pb2.GetUploadRequest(upload_id="x")),
            grpc.StatusCode.UNAUTHENTICATED,
            "MISSING_CREDENTIALS",
        ),
        (
            u.ListUploads(upload_pb2.ListUploadsRequest(page_token="!!"), metadata=md),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PAGE_TOKEN",
        ),
        (
            alice.files.ListFolder(upload_pb2.ListFolderRequest(page_size=-1), metadata=md),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
    ]
    for call, code, reason in cases:
        await expect_error(call, code, reason)
    upload = await u.CreateUpload(create_request(b"y" * (CHUNK + 1), CHUNK), metadata=md)
    for req, code, reason in [
        (
            upload_pb2.PutChunkRequest(
                upload_id=upload.upload_id, chunk_index=2, data=b"y", checksum=sha256(b"y")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "CHUNK_INDEX_OUT_OF_RANGE",
        ),
        (
            upload_pb2.PutChunkRequest(
                upload_id=upload.upload_id, chunk_index=0, data=b"y", checksum=sha256(b"y")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "CHUNK_SIZE_MISMATCH",
        ),
        (
            upload_pb2.PutChunkRequest(
                upload_id=upload.upload_id, chunk_index=1, data=b"y", checksum="abc"
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_CHECKSUM",
        ),
    ]:
        await expect_error(u.PutChunk(req, metadata=md), code, reason)
    # Another tenant's upload id is simply not found.
    await expect_error(
        mallory.uploads.PutChunk(
            chunk_request(upload.upload_id, 1, b"y"), metadata=mallory.metadata
        ),
        grpc.StatusCode.NOT_FOUND,
        "UPLOAD_NOT_FOUND",
    )
