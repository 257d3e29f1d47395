"""Helpers for file-tree tests: folders, shares and moves as one user, in one line each."""

from __future__ import annotations

import grpc
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import chunk_request, create_request, wait_status


async def folder(client, name: str, parent_id: str = "") -> str:
    """Create a folder; its id."""
    made = await client.files.CreateFolder(
        upload_pb2.CreateFolderRequest(name=name, parent_id=parent_id), metadata=client.metadata
    )
    return made.file_id


async def share(client, file_id: str, user_id: str, role: int = upload_pb2.ROLE_EDITOR) -> None:
    """Share `file_id` with `user_id`."""
    await client.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=file_id, user_id=user_id, role=role),
        metadata=client.metadata,
    )


def move(client, file_id: str, new_parent_id: str):
    """The MoveFile call (await it)."""
    return client.files.MoveFile(
        upload_pb2.MoveFileRequest(file_id=file_id, new_parent_id=new_parent_id),
        metadata=client.metadata,
    )


async def role(client, file_id: str) -> int | None:
    """The caller's role on `file_id`, None when it is NOT_FOUND for them."""
    try:
        found = await client.files.GetFile(
            upload_pb2.GetFileRequest(file_id=file_id), metadata=client.metadata
        )
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
        return None
    return found.role


async def listing(client, folder_id: str) -> dict[str, int]:
    """Every entry of a folder the caller sees: file id -> role."""
    seen: dict[str, int] = {}
    token = ""
    while True:
        page = await client.files.ListFolder(
            upload_pb2.ListFolderRequest(folder_id=folder_id, page_token=token),
            metadata=client.metadata,
        )
        seen.update({f.file_id: f.role for f in page.files})
        token = page.next_page_token
        if not token:
            return seen


async def parent_of(client, file_id: str) -> str:
    """The parent id of a file the caller can read."""
    found = await client.files.GetFile(
        upload_pb2.GetFileRequest(file_id=file_id), metadata=client.metadata
    )
    return found.parent_id


async def upload(client, data: bytes, name: str, folder_id: str = "") -> str:
    """Upload `data` (at most 1 KiB: one chunk) as a new file; the new file's id once merged."""
    made = await client.uploads.CreateUpload(
        create_request(data, 1024, name=name, folder_id=folder_id),
        metadata=client.metadata,
    )
    await client.uploads.PutChunk(chunk_request(made.upload_id, 0, data), metadata=client.metadata)
    done = await wait_status(client, made.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    return done.file_id
