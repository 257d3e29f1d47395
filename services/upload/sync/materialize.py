"""Files for items a delta discovers: the upstream item appears in the drive's folder.

An item first seen in a linked drive's delta (not linked by LinkItem, not known before)
becomes a file in the drive's folder, in the delta poll's transaction:
- owned by the drive link's owner (`linked_drives.owner_user_id`: the folder's owner at
  link time), tenant the drive's tenant; the linking user is the event's actor;
- its name is the upstream name made usable (NFC, forbidden characters replaced, at
  most 255 characters) and unique among the folder's live items: on a clash the newcomer
  is kept as "name (2).ext", "name (3).ext"... exactly as an upload's new file is
  (`tree.free_name`), so a sync never fails, renames nor hides a user's file;
- version 1 with its `file.content.updated` outbox event (invariant 6), the folder's
  listing version bumped, under the tenant's tree lock like every name decision.
Content stays upstream (no blob): size comes from the provider, checksum is empty.
No file is made when the drive has no folder or owner (links from before sync_0003), the
folder is gone, deleted or of another tenant, or the item is already expired.
"""

from __future__ import annotations

import unicodedata

from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.errors import InvalidArgument
from services.common.logging import get_logger
from services.upload.files.events import record_file_event
from services.upload.files.tree import (
    MAX_NAME_LENGTH,
    free_name,
    lock_tree,
    new_id,
    validate_name,
)
from services.upload.files.versions import touch_folder
from services.upload.models import FILE, FOLDER, FileRow, utcnow

log = get_logger(__name__)


def usable_name(upstream_name: str, upstream_item_id: str) -> str:
    """The upstream name as a valid local name (NFC; `/`, NUL, control chars -> `_`)."""
    name = unicodedata.normalize("NFC", upstream_name)
    name = "".join(c if c.isprintable() and c not in "/\x00" else "_" for c in name).strip()
    name = name[:MAX_NAME_LENGTH]
    if name in ("", ".", ".."):
        name = f"item-{upstream_item_id}"[:MAX_NAME_LENGTH]
    try:
        return validate_name(name)
    except InvalidArgument:
        # Unreachable for the forms above; a name we cannot vouch for gets a neutral one.
        return validate_name(f"item-{new_id()}")


async def create_file(
    session: AsyncSession, drive: RowMapping, upstream_item_id: str, name: str, size: int
) -> str | None:
    """Create the file for a newly discovered item in `session`; its id, or None (see above)."""
    if drive["folder_id"] is None or drive["owner_user_id"] is None:
        return None
    tenant = drive["tenant_id"]
    await lock_tree(session, tenant)
    folder = await session.get(FileRow, drive["folder_id"], populate_existing=True)
    if (
        folder is None
        or folder.tenant_id != tenant
        or folder.kind != FOLDER
        or folder.deleted_at is not None
    ):
        log.warning(
            "sync_drive_folder_unusable", drive_id=drive["id"], folder_id=drive["folder_id"]
        )
        return None
    now = utcnow()
    file = FileRow(
        id=new_id(),
        tenant_id=tenant,
        parent_id=folder.id,
        name=await free_name(session, tenant, folder.id, usable_name(name, upstream_item_id)),
        kind=FILE,
        owner_user_id=drive["owner_user_id"],
        version=1,
        children_version=0,
        size=max(size, 0),
        checksum="",
        checksum_algorithm="",
        blob_key=None,
        last_lock_token=0,
        created_at=now,
        updated_at=now,
    )
    session.add(file)
    await session.flush()
    await touch_folder(session, folder.id)
    await record_file_event(
        session,
        "file.content.updated",
        file,
        drive["linked_by"] or drive["owner_user_id"],
        idempotency_key=f"sync:{drive['id']}:{upstream_item_id}",
        file_id=file.id,
        name=file.name,
        size=file.size,
        checksum="",
        checksum_algorithm="",
        upload_id="",
    )
    log.info(
        "sync_file_created",
        drive_id=drive["id"],
        upstream_item_id=upstream_item_id,
        file_id=file.id,
        folder_id=folder.id,
    )
    return file.id
