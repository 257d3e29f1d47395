"""ListSharedWithMe: what others shared directly with the caller, scoped to the tenant."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from upload.tree_helpers import folder, share, upload
from upload.upload_helpers import expect_error

from services.common.config import DEFAULT_AUTH_TOKENS

# A second "bob" in tenant evil: a share row names only a user id, so a listing that
# forgot the tenant would show evil's share to acme's bob.
EVIL_BOB = "dev-evil-bob"


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    """The dev users plus bob of tenant evil."""
    tokens = {**DEFAULT_AUTH_TOKENS, EVIL_BOB: {"tenant_id": "evil", "user_id": "bob"}}
    return {"auth_tokens": tokens}


async def _shared(cluster, token: str, **kw: Any) -> upload_pb2.ListSharedWithMeResponse:
    stub = upload_pb2_grpc.FileServiceStub(cluster.channel)
    return await stub.ListSharedWithMe(
        upload_pb2.ListSharedWithMeRequest(**kw),
        metadata=(("authorization", f"Bearer {token}"),),
    )


async def test_shared_with_me_lists_direct_shares_in_the_tenant_only(cluster) -> None:
    alice, mallory = cluster["alice"], cluster["mallory"]
    docs = await folder(alice, "docs")
    report = await upload(alice, b"report", "report.txt")
    await upload(alice, b"private", "private.txt")
    await share(alice, docs, "bob", upload_pb2.ROLE_VIEWER)
    await share(alice, report, "bob", upload_pb2.ROLE_EDITOR)
    evil_file = await upload(mallory, b"evil", "evil.txt")
    await share(mallory, evil_file, "bob", upload_pb2.ROLE_EDITOR)

    got = await _shared(cluster, "dev-bob")
    assert {(i.file.file_id, i.role, i.granted_by) for i in got.items} == {
        (docs, upload_pb2.ROLE_VIEWER, "alice"),
        (report, upload_pb2.ROLE_EDITOR, "alice"),
    }
    assert all(i.file.tenant_id == "acme" and i.granted_at.seconds for i in got.items)
    assert [i.file.file_id for i in (await _shared(cluster, EVIL_BOB)).items] == [evil_file]
    assert not (await _shared(cluster, "dev-carol")).items
    assert not (await _shared(cluster, "dev-alice")).items

    # Pages of one: the token carries on; unshared and deleted items drop out.
    first = await _shared(cluster, "dev-bob", page_size=1)
    assert len(first.items) == 1 and first.next_page_token
    second = await _shared(cluster, "dev-bob", page_size=1, page_token=first.next_page_token)
    assert len(second.items) == 1 and not second.next_page_token
    assert {first.items[0].file.file_id, second.items[0].file.file_id} == {docs, report}
    # Another user's token is refused (bound to the caller).
    await expect_error(
        _shared(cluster, "dev-carol", page_token=first.next_page_token),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    await alice.files.UnshareFile(
        upload_pb2.UnshareFileRequest(file_id=docs, user_id="bob"), metadata=alice.metadata
    )
    await alice.files.DeleteFile(
        upload_pb2.DeleteFileRequest(file_id=report), metadata=alice.metadata
    )
    assert not (await _shared(cluster, "dev-bob")).items


async def test_shared_with_me_refuses_anonymous_and_bad_input(cluster) -> None:
    stub = upload_pb2_grpc.FileServiceStub(cluster.channel)
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await stub.ListSharedWithMe(upload_pb2.ListSharedWithMeRequest())
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    await expect_error(
        _shared(cluster, "dev-bob", page_size=-1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    await expect_error(
        _shared(cluster, "dev-bob", page_token="garbage"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )


async def test_the_listed_file_carries_the_callers_role_now_and_the_item_the_grant(
    cluster,
) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    team = await folder(alice, "team")
    plan = await upload(alice, b"plan", "plan.txt", team)
    # bob edits all of team, and is also granted plan alone as a viewer.
    await share(alice, team, "bob", upload_pb2.ROLE_EDITOR)
    await share(alice, plan, "bob", upload_pb2.ROLE_VIEWER)

    listed = {i.file.file_id: i for i in (await _shared(cluster, "dev-bob")).items}
    got = await bob.files.GetFile(upload_pb2.GetFileRequest(file_id=plan), metadata=bob.metadata)
    assert got.role == upload_pb2.ROLE_EDITOR
    assert listed[plan].file.role == got.role  # as GetFile, ListFolder and ListChanges say
    assert listed[plan].role == upload_pb2.ROLE_VIEWER  # what this share grants
