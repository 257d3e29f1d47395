"""The SDK's calls on the file tree (FileService): folders, moves, deletes, shares and
version history.

Each returns `Named` results (`serentak.sdk.named`): enum fields read as names.
`SerentakClient` inherits these; they need only its `files` stub.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Mapping

from serentak.sdk.named import Named, Role
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc

File = Named[upload_pb2.File]
FileVersion = Named[upload_pb2.FileVersion]
ChangePage = Named[upload_pb2.ListChangesResponse]
# How long one ListChanges of `changes(follow=True)` waits on the server for a change.
FOLLOW_WAIT_MS = 30_000


def role_value(role: int | str) -> int:
    """A Role from its number or its name (`viewer`, `editor`, `ROLE_EDITOR`)."""
    if isinstance(role, int):
        return int(role)
    for member in Role:
        if member == role or member.label == role.lower():
            return int(member)
    raise ValueError(f"unknown role {role!r} (viewer or editor)")


class FileCalls:
    """FileService calls of one caller (mixed into `SerentakClient`)."""

    @property
    def files(self) -> upload_pb2_grpc.FileServiceStub:
        """The raw FileService stub."""
        raise NotImplementedError

    async def get_file(self, file_id: str) -> File:
        """One file or folder you can see."""
        return Named(await self.files.GetFile(upload_pb2.GetFileRequest(file_id=file_id)))

    async def list_folder(self, folder_id: str = "") -> list[File]:
        """A folder's items (all pages); empty `folder_id`: your root."""
        out: list[File] = []
        token = ""
        while True:
            page = await self.files.ListFolder(
                upload_pb2.ListFolderRequest(folder_id=folder_id, page_token=token)
            )
            out.extend(Named(f) for f in page.files)
            token = page.next_page_token
            if not token:
                return out

    async def create_folder(
        self, name: str, *, parent_id: str = "", client_request_id: str = ""
    ) -> File:
        """A new folder `name` in `parent_id` (default: your root).

        The request id (default: a fresh one) makes a retry of this call return the same
        folder; a name the parent already has is ALREADY_EXISTS / NAME_TAKEN.
        """
        return Named(
            await self.files.CreateFolder(
                upload_pb2.CreateFolderRequest(
                    parent_id=parent_id,
                    name=name,
                    client_request_id=client_request_id or uuid.uuid4().hex,
                )
            )
        )

    async def move(self, file_id: str, new_parent_id: str, *, expected_version: int = 0) -> File:
        """Move a file or folder into another folder (`expected_version` 0: no check)."""
        return Named(
            await self.files.MoveFile(
                upload_pb2.MoveFileRequest(
                    file_id=file_id, new_parent_id=new_parent_id, expected_version=expected_version
                )
            )
        )

    async def rename(self, file_id: str, new_name: str, *, expected_version: int = 0) -> File:
        """Rename a file or folder in its folder (`expected_version` 0: no check)."""
        return Named(
            await self.files.RenameFile(
                upload_pb2.RenameFileRequest(
                    file_id=file_id, new_name=new_name, expected_version=expected_version
                )
            )
        )

    async def delete(self, file_id: str, *, expected_version: int = 0) -> File:
        """Soft-delete a file or folder (undo with `restore`)."""
        return Named(
            await self.files.DeleteFile(
                upload_pb2.DeleteFileRequest(file_id=file_id, expected_version=expected_version)
            )
        )

    async def restore(self, file_id: str, *, expected_version: int = 0) -> File:
        """Undo `delete` (its name must still be free in its folder)."""
        return Named(
            await self.files.RestoreFile(
                upload_pb2.RestoreFileRequest(file_id=file_id, expected_version=expected_version)
            )
        )

    async def share(self, file_id: str, user_id: str, role: int | str) -> File:
        """Give `user_id` (same tenant; a user id such as `bob`, not a token such as
        `dev-bob`) `role` (`viewer`/`editor`, or a Role number) on a file or folder."""
        return Named(
            await self.files.ShareFile(
                upload_pb2.ShareFileRequest(
                    file_id=file_id,
                    user_id=user_id,
                    role=role_value(role),  # type: ignore[arg-type]
                )
            )
        )

    async def share_many(
        self,
        file_id: str,
        grants: Mapping[str, int | str] | Iterable[tuple[str, int | str]],
        *,
        expected_version: int = 0,
    ) -> Named[upload_pb2.ShareFileBatchResponse]:
        """Give each user (same tenant, each once) its role on a file or folder, in one call
        (`ShareFileBatch`, at most the server's SERENTAK_SHARE_BATCH_MAX grants, 1,000 by
        default): one new version, and every collaborator, each new one included, is told
        once. Grants already in place change nothing, so a retry is safe; the answer counts
        the grants `added`, `changed` (another role) and `unchanged`."""
        pairs = grants.items() if isinstance(grants, Mapping) else grants
        request = upload_pb2.ShareFileBatchRequest(
            file_id=file_id,
            grants=[
                upload_pb2.ShareGrant(user_id=u, role=role_value(r))  # type: ignore[arg-type]
                for u, r in pairs
            ],
            expected_version=expected_version,
        )
        return Named(await self.files.ShareFileBatch(request))

    async def unshare(self, file_id: str, user_id: str) -> File:
        """Take `user_id`'s share on a file or folder away."""
        return Named(
            await self.files.UnshareFile(
                upload_pb2.UnshareFileRequest(file_id=file_id, user_id=user_id)
            )
        )

    async def collaborators(self, file_id: str) -> list[Named[upload_pb2.Collaborator]]:
        """Who has which role on a file or folder."""
        got = await self.files.ListCollaborators(
            upload_pb2.ListCollaboratorsRequest(file_id=file_id)
        )
        return [Named(c) for c in got.collaborators]

    async def shared_with_me(self) -> list[Named[upload_pb2.SharedItem]]:
        """Items of your tenant others shared directly with you (all pages)."""
        out: list[Named[upload_pb2.SharedItem]] = []
        token = ""
        while True:
            page = await self.files.ListSharedWithMe(
                upload_pb2.ListSharedWithMeRequest(page_token=token)
            )
            out.extend(Named(i) for i in page.items)
            token = page.next_page_token
            if not token:
                return out

    async def versions(self, file_id: str) -> list[FileVersion]:
        """A file's content versions, newest first (all pages): `version`, `size`,
        `checksum`, `author_user_id`, `created_at`, `current`, and `kept` (false once the
        retention policy deleted the bytes: `download(..., version=)` and
        `restore_version` then answer FAILED_PRECONDITION / VERSION_PURGED)."""
        out: list[FileVersion] = []
        token = ""
        while True:
            page = await self.files.ListVersions(
                upload_pb2.ListVersionsRequest(file_id=file_id, page_token=token)
            )
            out.extend(Named(v) for v in page.versions)
            token = page.next_page_token
            if not token:
                return out

    async def restore_version(
        self,
        file_id: str,
        version: int,
        *,
        expected_version: int = 0,
        client_request_id: str = "",
    ) -> Named[upload_pb2.RestoreVersionResponse]:
        """Make kept content `version` the file's next version (editors and owners): the
        answer's `file` is the file at its new version, `version` the new FileVersion.

        The request id (default: a fresh one) makes a retry of this call answer with the
        version the first one made; `expected_version` (0: no check) must be the file's
        version when the restore commits (ABORTED / VERSION_MISMATCH otherwise). Not the
        trash: `restore` undoes `delete`.
        """
        return Named(
            await self.files.RestoreVersion(
                upload_pb2.RestoreVersionRequest(
                    file_id=file_id,
                    version=version,
                    expected_version=expected_version,
                    client_request_id=client_request_id or uuid.uuid4().hex,
                )
            )
        )

    async def changes(
        self, cursor: str = "", *, follow: bool = False, page_size: int = 0
    ) -> AsyncIterator[ChangePage]:
        """The changes to everything you can see, page by page (ListChanges).

        From `cursor` "" the first pages are a snapshot of your whole view (`reset` set on
        the first: drop what you knew), then every change since, yours included. Apply each
        page's `changes` in order: `removed` drops `file_id`, otherwise `file` is the item
        as you see it now; then keep the page's `next_cursor` to resume from after a
        restart. Without `follow` the iteration ends once no more changes are ready; with
        it, it waits on the server (a long poll, no busy polling) and yields each page of
        new changes as it comes (and once the page that caught up, `has_more` false, even
        if empty), until you stop iterating. A cursor older than the server's
        retention fails FAILED_PRECONDITION / CURSOR_EXPIRED: start again from "".
        """
        caught_up = False
        while True:
            page = await self.files.ListChanges(
                upload_pb2.ListChangesRequest(
                    cursor=cursor,
                    page_size=page_size,
                    wait_ms=FOLLOW_WAIT_MS if follow and cursor else 0,
                )
            )
            cursor = page.next_cursor
            # Following, the first page with nothing more ready is yielded even if empty:
            # it says "caught up" (and carries the cursor).
            if page.changes or page.reset or not follow or not (page.has_more or caught_up):
                yield Named(page)
            caught_up = caught_up or not page.has_more
            if not page.has_more and not follow:
                return
