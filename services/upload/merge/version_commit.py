"""Committing new content as a file's next version: the one commit every path that makes
a version takes (the merge job, an inline merge, UploadFile, RestoreVersion).

Under the file lock's `token`, in the caller's transaction: the tenant's tree lock, the
fenced file update (`commit_fenced`, the one fencing check) or the new file row, the
folder's listing bump, the `file.content.updated` event with its change-log and audit rows,
and the upload's `merging -> completed` (or, for an upload not stored yet, its row stored
completed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from services.common import tracing
from services.common.jobs import ConflictError
from services.common.session_rows import new_object
from services.upload.files.events import record_file_event
from services.upload.files.tree import free_name, lock_tree
from services.upload.files.versions import add_file, commit_fenced, touch_folder
from services.upload.ingest.uploads import transition
from services.upload.models import (
    COMPLETED,
    FILE,
    MERGING,
    FileRow,
    UploadRow,
    utcnow,
)
from services.upload.storage.blob_store import content_key
from services.upload.storage.lifecycle.chunks import enqueue_chunk_purge


async def commit_content(
    session: AsyncSession,
    upload: UploadRow,
    result: Any,
    token: int,
    *,
    chunks: bool = True,
    checked_folder: FileRow | None = None,
    store_upload: Callable[[AsyncSession], Awaitable[None]] | None = None,
) -> FileRow:
    """Commit the merged content as the file's next version under lock `token`.

    One transaction (the caller's): the fenced file update (or the new file row), the
    parent folder's listing version, the outbox event and `merging -> completed`. Traced
    as `upload commit_version` (the statements; the COMMIT is the caller's).
    `checked_folder`: the caller checked in this transaction that the file is new and its
    name free in this folder, its parent (UploadFile), so none of them is read again.
    `store_upload`: the upload is not stored yet (UploadFile); it is set `completed` with
    its version and stored by this call, in place of the status move. A new file's row is
    then not kept in the session (`add_file`'s `kept`): UploadFile's transaction reads
    neither row back through it.
    """
    with tracing.span(
        "upload commit_version", upload_id=upload.id, file_id=upload.file_id, fencing_token=token
    ) as span:
        file = await _commit_content(
            session,
            upload,
            result,
            token,
            chunks=chunks,
            checked_folder=checked_folder,
            store_upload=store_upload,
        )
        tracing.annotate(span, version=file.version)
        return file


async def _commit_content(
    session: AsyncSession,
    upload: UploadRow,
    result: Any,
    token: int,
    *,
    chunks: bool,
    checked_folder: FileRow | None,
    store_upload: Callable[[AsyncSession], Awaitable[None]] | None,
) -> FileRow:
    now = utcnow()
    values: dict[str, Any] = {
        "size": result.size,
        "checksum": result.checksum,
        "checksum_algorithm": result.algorithm,
        "blob_key": content_key(upload.file_id, upload.id),
    }
    # The tree lock before any row (tree.lock_tree): the change is logged, the folder's
    # row bumped, and a new file's name must be free in its folder.
    await lock_tree(session, upload.tenant_id)
    existing = None
    if checked_folder is None:
        existing = await session.get(FileRow, upload.file_id, populate_existing=True)
    if existing is None:
        # If the name was taken since CreateUpload, the new file is kept as "name (2)"
        # (README "Access rules").
        folder = checked_folder or await session.get(FileRow, upload.folder_id)
        # A new file belongs to the folder's owner; the uploader is the event's actor.
        owner = folder.owner_user_id if folder is not None else upload.owner_user_id
        file = new_object(
            FileRow,
            dict(
                id=upload.file_id,
                tenant_id=upload.tenant_id,
                parent_id=upload.folder_id,
                name=upload.name
                if checked_folder is not None
                else await free_name(session, upload.tenant_id, upload.folder_id, upload.name),
                kind=FILE,
                owner_user_id=owner,
                version=1,
                children_version=0,
                last_lock_token=token,
                created_at=now,
                updated_at=now,
                **values,
            ),
        )
        await add_file(session, file, kept=store_upload is None)
    else:
        file = await commit_fenced(session, upload.file_id, token, **values)
    await touch_folder(session, file.parent_id)
    await record_file_event(
        session,
        "file.content.updated",
        file,
        upload.owner_user_id,
        idempotency_key=f"merge:{upload.id}",
        audience_of_new_file=existing is None,
        file_id=file.id,
        name=file.name,
        size=file.size,
        checksum=file.checksum,
        checksum_algorithm=file.checksum_algorithm,
        upload_id=upload.id,
    )
    finished = {
        "merge_finished_at": now,
        "file_version": file.version,
        "final_checksum": result.checksum,
    }
    if store_upload is not None:
        # Stored completed at once: one INSERT where the chunked path moves a stored row.
        for name, value in {"status": COMPLETED, "updated_at": now, **finished}.items():
            setattr(upload, name, value)
        await store_upload(session)
        return file
    moved = await transition(session, upload.id, MERGING, COMPLETED, **finished)
    if not moved:
        # Only this job moves a merging upload; losing here means a concurrent duplicate.
        raise ConflictError(f"upload {upload.id} left merging during the merge")
    # The chunks go only once COMPLETED is committed: the purge job is enqueued here, in
    # the same transaction (a retried merge, still `merging`, keeps finding them).
    # `chunks=False`: an upload stored whole (UploadFile) has none.
    if chunks:
        await enqueue_chunk_purge(session, upload.id)
    return file
