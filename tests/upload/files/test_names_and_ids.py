"""Names are NFC and unique per folder (ALREADY_EXISTS naming the holder); ids, principals
and client_request_ids are checked at the API, so no database column is the first to say no."""

from __future__ import annotations

import asyncio
import unicodedata

import grpc
from serentak.upload.v1 import upload_pb2
from upload.tree_helpers import folder, listing, move, share
from upload.upload_helpers import chunk_request, create_request, expect_error, wait_status

DECOMPOSED = "cafe\u0301"  # "café" as e + combining acute
COMPOSED = unicodedata.normalize("NFC", DECOMPOSED)


async def test_names_are_nfc_and_unique_in_a_folder(cluster) -> None:
    alice = cluster["alice"]
    md = alice.metadata
    parent = await folder(alice, "parent")
    made = await alice.files.CreateFolder(
        upload_pb2.CreateFolderRequest(name=DECOMPOSED, parent_id=parent), metadata=md
    )
    assert made.name == COMPOSED
    info = await expect_error(
        alice.files.CreateFolder(
            upload_pb2.CreateFolderRequest(name=COMPOSED, parent_id=parent), metadata=md
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        "NAME_TAKEN",
    )
    assert info.metadata["existing_file_id"] == made.file_id
    other = await folder(alice, "other", parent)
    info = await expect_error(
        alice.files.RenameFile(
            upload_pb2.RenameFileRequest(file_id=other, new_name=DECOMPOSED), metadata=md
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        "NAME_TAKEN",
    )
    assert info.metadata["existing_file_id"] == made.file_id
    # Renaming to its own name is no conflict.
    await alice.files.RenameFile(
        upload_pb2.RenameFileRequest(file_id=other, new_name="other"), metadata=md
    )
    # Move into a folder holding the name.
    elsewhere = await folder(alice, COMPOSED)
    info = await expect_error(
        move(alice, elsewhere, parent), grpc.StatusCode.ALREADY_EXISTS, "NAME_TAKEN"
    )
    assert info.metadata["existing_file_id"] == made.file_id
    # A deleted item frees its name; restoring it while the name is taken again is refused.
    await alice.files.DeleteFile(upload_pb2.DeleteFileRequest(file_id=made.file_id), metadata=md)
    again = await folder(alice, COMPOSED, parent)
    info = await expect_error(
        alice.files.RestoreFile(upload_pb2.RestoreFileRequest(file_id=made.file_id), metadata=md),
        grpc.StatusCode.ALREADY_EXISTS,
        "NAME_TAKEN",
    )
    assert info.metadata["existing_file_id"] == again
    # A new upload under a taken name is refused at CreateUpload (upload to its file_id for
    # a new version).
    info = await expect_error(
        alice.uploads.CreateUpload(
            create_request(b"x", 1024, name=DECOMPOSED, folder_id=parent), metadata=md
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        "NAME_TAKEN",
    )
    assert info.metadata["existing_file_id"] == again


async def test_racing_creates_of_one_name_make_one_item(cluster) -> None:
    alice = cluster["alice"]
    parent = await folder(alice, "race")
    for n in range(5):
        calls = [
            alice.files.CreateFolder(
                upload_pb2.CreateFolderRequest(name=f"same-{n}", parent_id=parent),
                metadata=alice.metadata,
            )
            for _ in range(6)
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        made = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(made) == 1, results
        assert all(
            isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.ALREADY_EXISTS
            for r in refused
        ), refused
    names = [
        f.name
        for f in (
            await alice.files.ListFolder(
                upload_pb2.ListFolderRequest(folder_id=parent), metadata=alice.metadata
            )
        ).files
    ]
    assert sorted(names) == [f"same-{n}" for n in range(5)]


async def test_uploads_racing_for_one_name_keep_both_files(cluster) -> None:
    """Both passed CreateUpload; the one merged second is kept as "name (2).ext"."""
    alice = cluster["alice"]
    parent = await folder(alice, "uploads")
    first, second = [
        await alice.uploads.CreateUpload(
            create_request(data, 1024, name="report.txt", folder_id=parent),
            metadata=alice.metadata,
        )
        for data in (b"one", b"two")
    ]
    for made, data in ((first, b"one"), (second, b"two")):
        await alice.uploads.PutChunk(
            chunk_request(made.upload_id, 0, data), metadata=alice.metadata
        )
        await wait_status(alice, made.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    names = sorted(
        f.name
        for f in (
            await alice.files.ListFolder(
                upload_pb2.ListFolderRequest(folder_id=parent), metadata=alice.metadata
            )
        ).files
    )
    assert names == ["report (2).txt", "report.txt"]


async def test_ids_and_principals_are_checked_at_the_api(cluster) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    md = alice.metadata
    mine = await folder(alice, "mine")
    long_id = "a" * 65
    for bad_user in ("u" * 65, "a:b", "", "bob smith", "../x"):
        for call in (
            alice.files.ShareFile(
                upload_pb2.ShareFileRequest(
                    file_id=mine, user_id=bad_user, role=upload_pb2.ROLE_VIEWER
                ),
                metadata=md,
            ),
            alice.files.UnshareFile(
                upload_pb2.UnshareFileRequest(file_id=mine, user_id=bad_user), metadata=md
            ),
        ):
            info = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PRINCIPAL")
            assert info.metadata["field"] == "user_id"
    # The longest allowed principal is stored on both databases.
    await share(alice, mine, "u" * 64, upload_pb2.ROLE_VIEWER)
    cases = [
        ("file_id", alice.files.GetFile(upload_pb2.GetFileRequest(file_id=long_id), metadata=md)),
        (
            "folder_id",
            alice.files.ListFolder(upload_pb2.ListFolderRequest(folder_id=long_id), metadata=md),
        ),
        (
            "parent_id",
            alice.files.CreateFolder(
                upload_pb2.CreateFolderRequest(name="x", parent_id=long_id), metadata=md
            ),
        ),
        ("new_parent_id", move(alice, mine, long_id)),
        ("file_id", move(alice, "x'; --", mine)),
        (
            "file_id",
            alice.files.ShareFile(
                upload_pb2.ShareFileRequest(
                    file_id=long_id, user_id="bob", role=upload_pb2.ROLE_VIEWER
                ),
                metadata=md,
            ),
        ),
        (
            "file_id",
            alice.files.ListCollaborators(
                upload_pb2.ListCollaboratorsRequest(file_id=long_id), metadata=md
            ),
        ),
    ]
    for field, call in cases:
        info = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ID")
        assert info.metadata["field"] == field
    info = await expect_error(
        alice.files.CreateFolder(
            upload_pb2.CreateFolderRequest(name="x", client_request_id="r" * 129), metadata=md
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_CLIENT_REQUEST_ID",
    )
    assert info.metadata["field"] == "client_request_id"
    # Another tenant's caller and a viewer still bounce off as before.
    await share(alice, mine, "bob", upload_pb2.ROLE_VIEWER)
    await expect_error(
        cluster["mallory"].files.ListFolder(
            upload_pb2.ListFolderRequest(folder_id=mine), metadata=cluster["mallory"].metadata
        ),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    )
    await expect_error(
        bob.files.CreateFolder(
            upload_pb2.CreateFolderRequest(name="b", parent_id=mine), metadata=bob.metadata
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "INSUFFICIENT_ROLE",
    )
    assert await listing(bob, mine) == {}
