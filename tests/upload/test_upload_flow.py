"""Uploads end to end on SQLite and PostgreSQL: create, chunks, resume, merge, abort."""

from __future__ import annotations

import os

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import (
    chunk_request,
    create_request,
    expect_error,
    sha256,
    split,
    wait_status,
)

from services.upload.storage.blob_store import content_key

CHUNK = 1024


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_upload_merges_to_a_new_file_version(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 3 + 100)
    upload = await alice.uploads.CreateUpload(
        create_request(data, CHUNK, client_request_id="r1", expected_checksum=sha256(data)),
        metadata=alice.metadata,
    )
    assert upload.status == upload_pb2.UPLOAD_STATUS_UPLOADING
    assert [(r.start, r.end) for r in upload.missing_ranges] == [(0, 4)]
    assert upload.expires_at.seconds > upload.created_at.seconds
    chunks = split(data, CHUNK)
    # Out of order: 2, 0; then the missing ranges tell the client what is left.
    for i in (2, 0):
        r = await alice.uploads.PutChunk(
            chunk_request(upload.upload_id, i, chunks[i]), metadata=alice.metadata
        )
        assert not r.duplicate
    got = await alice.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
    )
    assert got.received_chunk_count == 2
    assert [(r.start, r.end) for r in got.missing_ranges] == [(1, 2), (3, 4)]
    for i in (3, 1):
        await alice.uploads.PutChunk(
            chunk_request(upload.upload_id, i, chunks[i]), metadata=alice.metadata
        )
    done = await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    assert done.file_version == 1
    assert done.final_checksum == sha256(data)
    assert done.HasField("merge_started_at") and done.HasField("merge_finished_at")
    assert await cluster.blobs.read(content_key(done.file_id, done.upload_id)) == data


async def test_create_upload_is_idempotent_per_client_request_id(cluster) -> None:
    alice = cluster["alice"]
    req = create_request(b"x" * 10, CHUNK, client_request_id="same")
    first = await alice.uploads.CreateUpload(req, metadata=alice.metadata)
    again = await alice.uploads.CreateUpload(req, metadata=alice.metadata)
    assert first.upload_id == again.upload_id
    other = create_request(b"x" * 20, CHUNK, client_request_id="same")
    await expect_error(
        alice.uploads.CreateUpload(other, metadata=alice.metadata),
        grpc.StatusCode.ALREADY_EXISTS,
        "CLIENT_REQUEST_ID_REUSED",
    )


async def test_reused_client_request_id_for_another_target_is_refused(cluster) -> None:
    """Same id, different name / folder / target file / size / chunk count: never the
    earlier upload back (a retry with the same request still gets it)."""
    alice = cluster["alice"]
    docs = await alice.files.CreateFolder(
        upload_pb2.CreateFolderRequest(name="docs"), metadata=alice.metadata
    )
    data = b"x" * (CHUNK + 10)
    first = await alice.uploads.CreateUpload(
        create_request(data, CHUNK, name="a.bin", client_request_id="crid"),
        metadata=alice.metadata,
    )
    again = await alice.uploads.CreateUpload(
        create_request(data, CHUNK, name="a.bin", client_request_id="crid"),
        metadata=alice.metadata,
    )
    assert again.upload_id == first.upload_id
    existing = await alice.uploads.CreateUpload(
        create_request(b"old", CHUNK, name="old.bin"), metadata=alice.metadata
    )
    for i, part in enumerate(split(b"old", CHUNK)):
        await alice.uploads.PutChunk(
            chunk_request(existing.upload_id, i, part), metadata=alice.metadata
        )
    old = await wait_status(alice, existing.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    others = [
        create_request(data, CHUNK, name="b.bin", client_request_id="crid"),
        create_request(data, CHUNK, name="a.bin", folder_id=docs.file_id, client_request_id="crid"),
        create_request(b"x" * (CHUNK + 11), CHUNK, name="a.bin", client_request_id="crid"),
        create_request(b"x" * 10, CHUNK, name="a.bin", client_request_id="crid"),
    ]
    to_file = create_request(data, CHUNK, client_request_id="crid")
    to_file.ClearField("new_file")
    to_file.file_id = old.file_id
    for request in [*others, to_file]:
        await expect_error(
            alice.uploads.CreateUpload(request, metadata=alice.metadata),
            grpc.StatusCode.ALREADY_EXISTS,
            "CLIENT_REQUEST_ID_REUSED",
        )
    # And the other way round: an id first used for a file_id target.
    to_file.client_request_id = "crid-2"
    by_file = await alice.uploads.CreateUpload(to_file, metadata=alice.metadata)
    assert (await alice.uploads.CreateUpload(to_file, metadata=alice.metadata)).upload_id == (
        by_file.upload_id
    )
    await expect_error(
        alice.uploads.CreateUpload(
            create_request(data, CHUNK, name="old.bin", client_request_id="crid-2"),
            metadata=alice.metadata,
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        "CLIENT_REQUEST_ID_REUSED",
    )


async def test_upload_chunks_stream_and_duplicates(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 5)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    chunks = split(data, CHUNK)

    async def requests():
        for i in (4, 1, 1, 0):  # 1 twice: the second is a duplicate
            yield chunk_request(upload.upload_id, i, chunks[i])

    resp = await alice.uploads.UploadChunks(requests(), metadata=alice.metadata)
    assert [c.duplicate for c in resp.chunks] == [False, False, True, False]
    assert resp.upload.received_chunk_count == 3
    assert [(r.start, r.end) for r in resp.upload.missing_ranges] == [(2, 4)]

    async def rest():
        for i in (2, 3):
            yield chunk_request(upload.upload_id, i, chunks[i])

    await alice.uploads.UploadChunks(rest(), metadata=alice.metadata)
    await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)


async def test_abort_only_from_uploading(cluster) -> None:
    alice = cluster["alice"]
    data = b"a" * CHUNK * 2
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    aborted = await alice.uploads.AbortUpload(
        upload_pb2.AbortUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
    )
    assert aborted.status == upload_pb2.UPLOAD_STATUS_ABORTED
    # Status only moves forward: no chunks, no second abort.
    await expect_error(
        alice.uploads.PutChunk(
            chunk_request(upload.upload_id, 0, data[:CHUNK]), metadata=alice.metadata
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UPLOAD_NOT_ACTIVE",
    )
    await expect_error(
        alice.uploads.AbortUpload(
            upload_pb2.AbortUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UPLOAD_NOT_ACTIVE",
    )
    # A completed upload cannot be aborted either.
    small = await alice.uploads.CreateUpload(create_request(b"z", CHUNK), metadata=alice.metadata)
    await alice.uploads.PutChunk(chunk_request(small.upload_id, 0, b"z"), metadata=alice.metadata)
    await wait_status(alice, small.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    await expect_error(
        alice.uploads.AbortUpload(
            upload_pb2.AbortUploadRequest(upload_id=small.upload_id), metadata=alice.metadata
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UPLOAD_NOT_ACTIVE",
    )


async def test_list_uploads_pages(cluster) -> None:
    alice = cluster["alice"]
    ids = []
    for i in range(5):
        u = await alice.uploads.CreateUpload(
            create_request(b"q", CHUNK, name=f"n{i}"), metadata=alice.metadata
        )
        ids.append(u.upload_id)
    seen, token = [], ""
    while True:
        page = await alice.uploads.ListUploads(
            upload_pb2.ListUploadsRequest(page_size=2, page_token=token), metadata=alice.metadata
        )
        seen += [u.upload_id for u in page.uploads]
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted(ids)
    bob = cluster["bob"]
    theirs = await bob.uploads.ListUploads(upload_pb2.ListUploadsRequest(), metadata=bob.metadata)
    assert list(theirs.uploads) == []
