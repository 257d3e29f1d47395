"""Domain events of the file tree, built for the outbox (serentak.events.v1.Event), each
with its audit row (services/common/audit) in the same transaction.

Each event carries the file's new version, an idempotency key naming the change, a dedupe
key (renames of one file share one, so a burst collapses; content updates get one per
version, so none is merged away), the correlation id and the audience at commit time.

An item deleted for good (the trash purge, the sync purge) ends its aggregate with
`file.purged` (`record_purged`): the version after its last, written in the transaction
that deletes the row, so a subscriber applies it after every earlier event and may then
forget the aggregate.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy.ext.asyncio import AsyncSession

from services.common import audit
from services.common.correlation import current_correlation_id
from services.common.outbox.store import record_event
from services.upload.files import change_log
from services.upload.files.permissions import audience, new_file_audience
from services.upload.files.tree import lock_tree
from services.upload.models import FOLDER, FileRow

# event_type -> (payload field, dedupe key template)
_KINDS: dict[str, tuple[str, str]] = {
    "file.content.updated": ("file_content_updated", "file:{id}:content:v{version}"),
    "file.renamed": ("file_renamed", "file:{id}:renamed"),
    "file.moved": ("file_moved", "file:{id}:moved"),
    "file.deleted": ("file_deleted", "file:{id}:deleted:v{version}"),
    "file.restored": ("file_restored", "file:{id}:restored:v{version}"),
    "file.shared": ("file_shared", "file:{id}:shared:{user}"),
    "file.unshared": ("file_unshared", "file:{id}:unshared:{user}"),
    "folder.created": ("folder_created", "folder:{id}:created"),
}


async def record_file_event(
    session: AsyncSession,
    event_type: str,
    file: FileRow,
    actor_user_id: str,
    *,
    idempotency_key: str | None = None,
    seen_by: Iterable[str] = (),
    audience_of_new_file: bool = False,
    **payload: Any,
) -> events_pb2.Event:
    """Write one event about `file` (at its current version) to the outbox, in `session`.
    `audience_of_new_file`: `file` was made in this transaction (its audience is read once
    per folder and transaction: `permissions.new_file_audience`).

    The change is logged for ListChanges too (change_log.py): for its audience, the users
    in `seen_by` (who could see the item before: a move's old audience) and the user a
    share names. The tenant's tree lock is taken first (a no-op where the change holds it
    already, as it must: `tree.lock_tree`).
    """
    await lock_tree(session, file.tenant_id)
    field, dedupe = _KINDS[event_type]
    event = events_pb2.Event(
        event_id=uuid.uuid4().hex,
        event_type=event_type,
        aggregate_type="folder" if file.kind == FOLDER else "file",
        aggregate_id=file.id,
        tenant_id=file.tenant_id,
        actor_user_id=actor_user_id,
        version=file.version,
        idempotency_key=idempotency_key or f"{event_type}:{file.id}:v{file.version}",
        dedupe_key=dedupe.format(id=file.id, version=file.version, user=payload.get("user_id", "")),
        correlation_id=current_correlation_id(),
        audience_user_ids=await (
            new_file_audience(session, file) if audience_of_new_file else audience(session, file)
        ),
    )
    getattr(event, field).CopyFrom(getattr(events_pb2, _message_name(field))(**payload))
    await record_event(session, event)
    named = {payload.get("user_id", "")} | {g.user_id for g in payload.get("grants", ())}
    await change_log.append(session, event_type, file, [*event.audience_user_ids, *seen_by], named)
    # Same transaction as the change and its event: the trail shows exactly what committed.
    await audit.record(
        session,
        tenant_id=file.tenant_id,
        principal=actor_user_id,
        action=event_type,
        target_type=event.aggregate_type,
        target_id=file.id,
        detail=_audit_detail(file, payload),
    )
    return event


async def record_purged(
    session: AsyncSession, tenant_id: str, items: Iterable[tuple[str, str, int]]
) -> None:
    """Write the terminal `file.purged` event of each item `(id, kind, last version)`
    deleted for good in `session` (the caller holds the tenant's tree lock and deletes the
    rows in this transaction). No change log row or audit row of its own: the log showed
    the deletion, and the purge writes its own audit row."""
    for file_id, kind, version in items:
        event = events_pb2.Event(
            event_id=uuid.uuid4().hex,
            event_type="file.purged",
            aggregate_type="folder" if kind == FOLDER else "file",
            aggregate_id=file_id,
            tenant_id=tenant_id,
            version=version + 1,
            idempotency_key=f"file.purged:{file_id}:v{version + 1}",
            dedupe_key=f"file:{file_id}:purged",
            correlation_id=current_correlation_id(),
            # Told to nobody: its deletion was announced when it happened, and the purge is
            # the retention's doing, no one's action.
            audience_user_ids=[],
            file_purged=events_pb2.FilePurged(file_id=file_id),
        )
        await record_event(session, event)


def _audit_detail(file: FileRow, payload: dict[str, Any]) -> dict[str, Any]:
    """The change in a few JSON fields: the new version and the event's scalars."""
    detail: dict[str, Any] = {"version": file.version}
    for key, value in payload.items():
        if key == "grants":
            detail[key] = [{"user_id": g.user_id, "role": g.role} for g in value]
        elif key != "file_id" and isinstance(value, str | int) and value != "":
            detail[key] = value
    return detail


def _message_name(field: str) -> str:
    return "".join(part.capitalize() for part in field.split("_"))
