"""ShareFile refuses a bearer token given as the user (`dev-bob` for `bob`): such a share
would be granted to nobody, and nothing would say so."""

from __future__ import annotations

import grpc
from serentak.upload.v1 import upload_pb2
from upload.tree_helpers import folder, share
from upload.upload_helpers import expect_error


def _share(client, file_id: str, user_id: str):
    return client.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=file_id, user_id=user_id, role=upload_pb2.ROLE_EDITOR),
        metadata=client.metadata,
    )


async def test_a_token_for_a_user_is_refused_naming_the_user(cluster) -> None:
    alice = cluster["alice"]
    docs = await folder(alice, "docs")
    info = await expect_error(
        _share(alice, docs, "dev-bob"), grpc.StatusCode.INVALID_ARGUMENT, "USER_ID_IS_A_TOKEN"
    )
    assert info.metadata["user_id"] == "bob" and info.metadata["field"] == "user_id"
    # Another tenant's token, or a service's: refused, and its user is not told.
    for token in ("dev-mallory", "dev-service-upload"):
        other = await expect_error(
            _share(alice, docs, token), grpc.StatusCode.INVALID_ARGUMENT, "USER_ID_IS_A_TOKEN"
        )
        assert "user_id" not in other.metadata
    collaborators = await alice.files.ListCollaborators(
        upload_pb2.ListCollaboratorsRequest(file_id=docs), metadata=alice.metadata
    )
    assert list(collaborators.collaborators) == []
    # The user id itself is shared with as before.
    await share(alice, docs, "bob")
    collaborators = await alice.files.ListCollaborators(
        upload_pb2.ListCollaboratorsRequest(file_id=docs), metadata=alice.metadata
    )
    assert [c.user_id for c in collaborators.collaborators] == ["bob"]
