"""Retiring files whose upstream copy is gone for good (the sync purge's hook).

A tombstoned synced file is hidden while its tombstone row exists. When the sync purge
deletes tombstones past retention it calls `retire_files` in the same transaction, so
the file goes with its tombstone and nothing can show it again: the row (and its shares)
is deleted, after a version bump and a `file.deleted` outbox event (invariant 6) naming
the folder's audience and the terminal `file.purged` (told to nobody: subscribers may
forget the file), and the folder's listing version moves. The bytes of every version
the file had are deleted by the next `upload.reclaim` run (`lifecycle/sweep.py`, retired
files). Folders are not retired (their
tombstone row stays, keeping them hidden). Tenants are locked in sorted order, so two
purgers never wait on each other in a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.logging import get_logger
from services.upload.files.events import record_file_event, record_purged
from services.upload.files.tree import lock_tree
from services.upload.files.versions import bump, touch_folder
from services.upload.models import FILE, FileRow, ShareRow

log = get_logger(__name__)


async def retire_files(session: AsyncSession, file_ids: Sequence[str]) -> set[str]:
    """Delete these files (see above) in `session`; returns the ids now gone."""
    gone: set[str] = set()
    found: list[FileRow] = []
    for file_id in dict.fromkeys(file_ids):
        file = await session.get(FileRow, file_id, populate_existing=True)
        if file is None:
            gone.add(file_id)  # nothing left to keep hidden
        elif file.kind == FILE:
            found.append(file)
    for tenant in sorted({f.tenant_id for f in found}):
        await lock_tree(session, tenant)
    for file in found:
        file = await bump(session, file, 0)
        await record_file_event(
            session,
            "file.deleted",
            file,
            "",
            idempotency_key=f"sync-retire:{file.id}",
            file_id=file.id,
            name=file.name,
        )
        await record_purged(session, file.tenant_id, [(file.id, file.kind, file.version)])
        await session.execute(delete(ShareRow).where(ShareRow.file_id == file.id))
        parent = file.parent_id
        await session.delete(file)
        await session.flush()
        await touch_folder(session, parent)
        gone.add(file.id)
        log.info("sync_file_retired", file_id=file.id, tenant_id=file.tenant_id)
    return gone
