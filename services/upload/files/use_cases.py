"""The file tree's use cases: folders, metadata changes, sharing (`sharing.py`), listing, download.

Every change bumps the file's version (`versions.bump`) and records its outbox event in
the same transaction (invariant 6); the parent folder's listing version moves with it and
the listing cache is invalidated only after the commit (invariant 11).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import audit, validation
from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.common.group_commit import GroupCommits
from services.common.page_tokens import PageTokens
from services.upload.errors import ContentReplaced, FileDeleted, VersionPurged, WrongKind
from services.upload.files import history, sharing
from services.upload.files.events import record_file_event
from services.upload.files.listing import list_page
from services.upload.files.listing_cache import ListingCache
from services.upload.files.permissions import (
    MAX_DEPTH,
    audience,
    chain,
    check_move,
    reaches_root,
    readable,
    role_of,
    writable,
)
from services.upload.files.shared import list_shared_with_me
from services.upload.files.tree import (
    TreeTooDeep,
    ensure_root,
    folder_height,
    lock_tree,
    new_folder,
    require_free_name,
    validate_name,
)
from services.upload.files.versions import bump, touch_folder
from services.upload.files.visibility import raise_if_hidden
from services.upload.models import FILE, FOLDER, FileRow, ShareRow, utcnow
from services.upload.storage.blob_store import BlobStore

DOWNLOAD_BLOCK = 1024 * 1024

# A check run inside a change's transaction, after the file is loaded with the caller's role.
Check = Callable[[AsyncSession, FileRow, str], Awaitable[None]]


class Files:
    """FileService use cases, scoped to the caller's tenant and role."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        blobs: BlobStore,
        cache: ListingCache,
        tokens: PageTokens,
        share_batch_max: int = 1_000,
        groups: GroupCommits | None = None,
    ) -> None:
        self._sessions = sessions
        self._groups = groups
        self._blobs = blobs
        self._cache = cache
        self._tokens = tokens
        self._share_batch_max = share_batch_max

    async def create_folder(
        self, identity: Identity, request: upload_pb2.CreateFolderRequest
    ) -> tuple[FileRow, str]:
        """A new folder (idempotent per client_request_id; ALREADY_EXISTS on a taken name)."""
        name = validate_name(request.name)
        validation.resource_id(request.parent_id, "parent_id", required=False)
        crid = validation.client_request_id(request.client_request_id)
        parent_id = request.parent_id or await ensure_root(self._sessions, identity)
        key = f"{identity.tenant_id}:{identity.user_id}:{crid}" if crid else None
        try:
            async with self._sessions.begin() as session:
                await lock_tree(session, identity.tenant_id)
                if key is not None:
                    found = (
                        await session.execute(
                            select(FileRow).where(FileRow.create_request_key == key)
                        )
                    ).scalar_one_or_none()
                    if found is not None:
                        return found, await role_of(session, identity, found) or ""
                parent, _ = await writable(session, identity, parent_id)
                _require_live_folder(parent, "parent_id")
                links = await chain(session, identity.tenant_id, parent.id)
                if len(links) >= MAX_DEPTH or not reaches_root(links):
                    raise TreeTooDeep(f"folders nest at most {MAX_DEPTH} deep", file_id=parent.id)
                await require_free_name(session, identity, parent.id, name, "name")
                folder = new_folder(
                    identity.tenant_id,
                    parent.id,
                    name,
                    parent.owner_user_id,
                    create_request_key=key,
                )
                session.add(folder)
                await session.flush()
                await touch_folder(session, parent.id)
                await record_file_event(
                    session,
                    "folder.created",
                    folder,
                    identity.user_id,
                    folder_id=folder.id,
                    parent_id=parent.id,
                    name=name,
                )
                role = await role_of(session, identity, folder) or ""
        except IntegrityError:
            return await self.create_folder(identity, request)
        self._cache.invalidate_folder(parent_id)
        return folder, role

    async def get(self, identity: Identity, file_id: str) -> tuple[FileRow, str]:
        """The file and the caller's role (FILE_RETENTION_EXPIRED once tombstoned upstream)."""
        async with self._sessions() as session:
            await read_only(session)
            # Permission first: another tenant learns nothing about the file.
            found = await readable(session, identity, _required(file_id, "file_id"))
            await raise_if_hidden(session, identity.tenant_id, file_id)
            return found

    async def list_folder(
        self, identity: Identity, request: upload_pb2.ListFolderRequest
    ) -> upload_pb2.ListFolderResponse:
        """One page of a folder's children the caller may see, with the caller's role on each."""
        validation.resource_id(request.folder_id, "folder_id", required=False)
        folder_id = request.folder_id or await ensure_root(self._sessions, identity)
        async with self._sessions() as session:
            # A snapshot without SQLite's write lock: a listing never holds up writers.
            await read_only(session)
            return await list_page(session, self._cache, self._tokens, identity, folder_id, request)

    async def _change(
        self,
        identity: Identity,
        file_id: str,
        expected_version: int,
        event_type: str,
        *,
        check: Check | None = None,
        **values: object,
    ) -> tuple[FileRow, str, set[str | None]]:
        """Apply a metadata change with its event; returns the file, role and touched folders.

        The tree lock is taken first, so `check` (names, cycles) and the write are one step
        for every other change of the tenant's tree.
        """
        _required(file_id, "file_id")
        async with self._sessions.begin() as session:
            await lock_tree(session, identity.tenant_id)
            file, role = await writable(session, identity, file_id)
            if check is not None:
                await check(session, file, role)
            old = (file.name, file.parent_id)
            # Who could see it before: a move can take it (and all under it) out of a view.
            seen_by = await audience(session, file) if event_type == "file.moved" else []
            file = await bump(session, file, expected_version, **values)
            touched = {old[1], file.parent_id}
            for folder in touched:
                await touch_folder(session, folder)
            payload: dict[str, Any] = {"file_id": file.id}
            if event_type == "file.renamed":
                payload.update(old_name=old[0], new_name=file.name)
            elif event_type == "file.moved":
                payload.update(
                    old_parent_id=old[1] or "", new_parent_id=file.parent_id or "", name=file.name
                )
            else:
                payload["name"] = file.name
            await record_file_event(
                session, event_type, file, identity.user_id, seen_by=seen_by, **payload
            )
        for folder in touched:
            self._cache.invalidate_folder(folder)
        return file, role, touched

    async def rename(
        self, identity: Identity, request: upload_pb2.RenameFileRequest
    ) -> tuple[FileRow, str]:
        """Rename a file or folder."""
        name = validate_name(request.new_name, "new_name")

        async def name_free(session: AsyncSession, file: FileRow, _role: str) -> None:
            if file.parent_id is not None and file.deleted_at is None:
                await require_free_name(
                    session, identity, file.parent_id, name, "new_name", except_id=file.id
                )

        file, role, _ = await self._change(
            identity,
            request.file_id,
            request.expected_version,
            "file.renamed",
            check=name_free,
            name=name,
        )
        return file, role

    async def move(
        self, identity: Identity, request: upload_pb2.MoveFileRequest
    ) -> tuple[FileRow, str]:
        """Move into another folder (README "Access rules"; never into itself or below it).

        The cycle check and the write are one transaction under the tenant's tree lock, so
        two racing moves (A into B, B into A) cannot both pass the check.
        """
        target_id = _required(request.new_parent_id, "new_parent_id")

        async def allowed(session: AsyncSession, file: FileRow, role: str) -> None:
            if file.parent_id is None:
                raise InvalidArgument(
                    "file_id", "a root folder cannot be moved", reason="ROOT_FOLDER"
                )
            target, _ = await writable(session, identity, target_id)
            _require_live_folder(target, "new_parent_id")
            check_move(role, file, target)
            links = await chain(session, identity.tenant_id, target.id)
            if any(link.id == file.id for link in links):
                raise InvalidArgument(
                    "new_parent_id", "is the file itself or inside it", reason="MOVE_CYCLE"
                )
            below = await folder_height(session, file.id, MAX_DEPTH) if file.kind == FOLDER else -1
            if not reaches_root(links) or len(links) + 1 + below > MAX_DEPTH:
                raise TreeTooDeep(f"folders nest at most {MAX_DEPTH} deep", file_id=target.id)
            if file.deleted_at is None:
                await require_free_name(
                    session, identity, target.id, file.name, "new_parent_id", except_id=file.id
                )

        file, role, _ = await self._change(
            identity,
            request.file_id,
            request.expected_version,
            "file.moved",
            check=allowed,
            parent_id=target_id,
        )
        return file, role

    async def delete(
        self, identity: Identity, request: upload_pb2.DeleteFileRequest
    ) -> tuple[FileRow, str]:
        """Soft delete (restorable)."""
        file, _ = await self.get(identity, request.file_id)
        if file.deleted_at is not None:
            raise FileDeleted("the file is already deleted", file_id=file.id)
        if file.parent_id is None:
            raise InvalidArgument(
                "file_id", "a root folder cannot be deleted", reason="ROOT_FOLDER"
            )
        file, role, _ = await self._change(
            identity, request.file_id, request.expected_version, "file.deleted", deleted_at=utcnow()
        )
        return file, role

    async def restore(
        self, identity: Identity, request: upload_pb2.RestoreFileRequest
    ) -> tuple[FileRow, str]:
        """Undo a soft delete."""
        file, _ = await self.get(identity, request.file_id)
        if file.deleted_at is None:
            raise FileDeleted("the file is not deleted", file_id=file.id, reason="FILE_NOT_DELETED")

        async def name_free(session: AsyncSession, file: FileRow, _role: str) -> None:
            if file.parent_id is not None:
                await require_free_name(
                    session, identity, file.parent_id, file.name, "file_id", except_id=file.id
                )

        file, role, _ = await self._change(
            identity,
            request.file_id,
            request.expected_version,
            "file.restored",
            check=name_free,
            deleted_at=None,
        )
        return file, role

    async def share(
        self, identity: Identity, request: upload_pb2.ShareFileRequest
    ) -> tuple[FileRow, str]:
        """Grant `user_id` viewer or editor (owner only)."""
        file = await sharing.share(self._sessions, identity, request)
        self._cache.invalidate_folder(file.parent_id)
        return file, "owner"

    async def share_batch(
        self, identity: Identity, request: upload_pb2.ShareFileBatchRequest
    ) -> sharing.BatchOutcome:
        """Grant many users their roles at once (owner only): one version, one event."""
        outcome = await sharing.share_batch(
            self._sessions, identity, request, self._share_batch_max
        )
        self._cache.invalidate_folder(outcome.file.parent_id)
        return outcome

    async def unshare(
        self, identity: Identity, request: upload_pb2.UnshareFileRequest
    ) -> tuple[FileRow, str]:
        """Revoke a collaborator (owner only); the revoked user is still told (audience)."""
        file = await sharing.unshare(self._sessions, identity, request)
        self._cache.invalidate_folder(file.parent_id)
        return file, "owner"

    async def shared_with_me(
        self, identity: Identity, request: upload_pb2.ListSharedWithMeRequest
    ) -> upload_pb2.ListSharedWithMeResponse:
        """A page of the items shared directly with the caller (services/upload/files/shared.py)."""
        return await list_shared_with_me(self._sessions, self._tokens, identity, request)

    async def collaborators(self, identity: Identity, file_id: str) -> list[ShareRow]:
        """Direct shares of a file the caller can read."""
        return await sharing.collaborators(self._sessions, identity, file_id)

    async def list_versions(
        self, identity: Identity, request: upload_pb2.ListVersionsRequest
    ) -> upload_pb2.ListVersionsResponse:
        """A page of the file's content versions, newest first (files/history.py)."""
        return await history.list_versions(self._sessions, self._tokens, identity, request)

    async def open_download(
        self, identity: Identity, request: upload_pb2.DownloadRequest
    ) -> tuple[history.Content, AsyncIterator[bytes]]:
        """The content to read (current, or kept version `request.version`) and an
        iterator over its bytes from `offset`, at most `length` of them (0: to the end)."""
        if request.length < 0:
            raise InvalidArgument("length", "must not be negative (0: to the end)")
        async with self._sessions() as session:
            await read_only(session)
            # Permission first: another tenant learns nothing about the file.
            file, _ = await readable(session, identity, _required(request.file_id, "file_id"))
            await raise_if_hidden(session, identity.tenant_id, file.id)
            if file.kind != FILE:
                raise WrongKind("cannot download a folder", file_id=file.id)
            if file.deleted_at is not None:
                raise FileDeleted("the file is deleted", file_id=file.id)
            content = await history.version_content(session, file, request.version)
        if not 0 <= request.offset <= content.size:
            raise InvalidArgument("offset", f"must be 0..{content.size}")

        # A read changes nothing to share a transaction with: its audit row has its own,
        # shared with the other small writes of the moment (group commit) when wired.
        async def record(session: AsyncSession) -> None:
            await audit.record(
                session,
                tenant_id=identity.tenant_id,
                principal=audit.principal_of(identity),
                action="file.downloaded",
                target_type="file",
                target_id=file.id,
                detail={"version": content.version or file.version, "offset": request.offset},
            )

        if self._groups is not None:
            await self._groups.run(record, (identity.tenant_id,))
        else:
            async with self._sessions.begin() as session:
                await record(session)
        blocks = self._blobs.iter_read(content.key, request.offset, DOWNLOAD_BLOCK)
        if request.length:
            blocks = _at_most(blocks, request.length)
        return content, _replaced_is_aborted(blocks, file.id, request.version)


async def _at_most(blocks: AsyncIterator[bytes], length: int) -> AsyncIterator[bytes]:
    """The first `length` bytes of `blocks` (the store's read is dropped after them)."""
    left = length
    async for block in blocks:
        if len(block) >= left:
            yield block[:left]
            return
        yield block
        left -= len(block)


async def _replaced_is_aborted(
    blocks: AsyncIterator[bytes], file_id: str, version: int = 0
) -> AsyncIterator[bytes]:
    """A version deleted by the retention policy while being read ends the download
    ABORTED/CONTENT_REPLACED (the bytes sent so far were that version's); an older
    `version` asked for by number and deleted before its first byte is VERSION_PURGED."""
    sent = False
    try:
        async for block in blocks:
            sent = True
            yield block
    except FileNotFoundError as exc:
        if version and not sent:
            raise VersionPurged(
                f"version {version}'s content was deleted by the retention policy",
                file_id=file_id,
                version=version,
            ) from exc
        raise ContentReplaced(
            "this version of the file was replaced and deleted; download again", file_id=file_id
        ) from exc


def _required(value: str, field: str) -> str:
    return validation.resource_id(value, field)


def _require_live_folder(row: FileRow, field: str) -> None:
    if row.kind != FOLDER:
        raise WrongKind(f"{field} is not a folder", file_id=row.id)
    if row.deleted_at is not None:
        raise FileDeleted("the folder is deleted", file_id=row.id)
