"""Page tokens are opaque and authenticated (issue 11, item 10): anything this deployment
did not issue for that very listing is INVALID_ARGUMENT / INVALID_PAGE_TOKEN, never INTERNAL."""

from __future__ import annotations

import base64
import json

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import create_request, expect_error

from services.common.page_tokens import PageTokens

CHUNK = 1024


def _b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()


NESTED = base64.urlsafe_b64encode(b"[" * 100_000 + b"]" * 100_000).decode()
# What main used to issue (base64 JSON), a deeply nested body, a forged MAC, garbage.
HOSTILE = [
    _b64(["2020-01-01T00:00:00", "x"]),
    _b64(["not a date", "x"]),
    NESTED[:2000],
    f"{_b64(['ListUploads::0', '2020-01-01T00:00:00', 'x'])}.AAAAAAAAAAAAAAAAAAAAAA",
    PageTokens("another-deployment-secret").encode("ListUploads::0", ["2020", "x"]),
    "!!",
    "a.b.c",
    "é.é",
    "x" * 5000,
]


@pytest.mark.parametrize("token", HOSTILE)
async def test_list_uploads_refuses_tokens_it_did_not_issue(cluster, token: str) -> None:
    alice = cluster["alice"]
    await expect_error(
        alice.uploads.ListUploads(
            upload_pb2.ListUploadsRequest(page_token=token), metadata=alice.metadata
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )


async def test_list_folder_refuses_hostile_tokens(cluster) -> None:
    alice = cluster["alice"]
    for token in (NESTED[:2000], _b64(["a", "b"]), "garbage"):
        await expect_error(
            alice.files.ListFolder(
                upload_pb2.ListFolderRequest(page_token=token), metadata=alice.metadata
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PAGE_TOKEN",
        )


async def test_a_token_works_only_for_the_listing_that_issued_it(cluster) -> None:
    alice = cluster["alice"]
    md = alice.metadata
    one = await alice.files.CreateFolder(upload_pb2.CreateFolderRequest(name="one"), metadata=md)
    two = await alice.files.CreateFolder(upload_pb2.CreateFolderRequest(name="two"), metadata=md)
    for i in range(3):
        await alice.files.CreateFolder(
            upload_pb2.CreateFolderRequest(name=f"c{i}", parent_id=one.file_id), metadata=md
        )
        await alice.uploads.CreateUpload(create_request(b"q", CHUNK, name=f"n{i}"), metadata=md)
    page = await alice.files.ListFolder(
        upload_pb2.ListFolderRequest(folder_id=one.file_id, page_size=1), metadata=md
    )
    assert page.next_page_token
    # The genuine next page works...
    more = await alice.files.ListFolder(
        upload_pb2.ListFolderRequest(
            folder_id=one.file_id, page_size=1, page_token=page.next_page_token
        ),
        metadata=md,
    )
    assert [f.name for f in more.files] == ["c1"]
    # ...but not against another folder, nor as a ListUploads token.
    await expect_error(
        alice.files.ListFolder(
            upload_pb2.ListFolderRequest(folder_id=two.file_id, page_token=page.next_page_token),
            metadata=md,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    await expect_error(
        alice.uploads.ListUploads(
            upload_pb2.ListUploadsRequest(page_token=page.next_page_token), metadata=md
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    uploads = await alice.uploads.ListUploads(
        upload_pb2.ListUploadsRequest(page_size=1), metadata=md
    )
    assert uploads.next_page_token
    # A page token of the caller's uploads is refused for another filter.
    await expect_error(
        alice.uploads.ListUploads(
            upload_pb2.ListUploadsRequest(status=1, page_token=uploads.next_page_token),
            metadata=md,
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
