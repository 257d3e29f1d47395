"""gRPC surface of `serentak.upload.v1.SyncService` (operators and internal callers).

Access: every row is the caller's tenant's (another tenant's ids are NOT_FOUND). Linking
a file, or a drive into a folder, needs write access to it (`permissions.writable`: a
viewer gets PERMISSION_DENIED, a stranger NOT_FOUND). A tenant without a provider
credential cannot link or trigger anything: FAILED_PRECONDITION /
SYNC_PROVIDER_NOT_CONFIGURED, and no job is queued.
"""

from __future__ import annotations

from datetime import datetime

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from serentak.upload.v1 import sync_pb2, sync_pb2_grpc
from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.auth import Authenticator, Identity
from services.common.errors import AlreadyExists, InvalidArgument
from services.upload.errors import WrongKind
from services.upload.files import permissions
from services.upload.models import FOLDER
from services.upload.sync import items
from services.upload.sync.engine import SyncEngine
from services.upload.sync.errors import (
    FileRetentionExpired,
    LinkedDriveNotFound,
    SyncedItemNotFound,
    SyncProviderNotConfigured,
)
from services.upload.sync.jobs import (
    ENSURE,
    enqueue_delta_poll,
    enqueue_item_sync,
    enqueue_subscription,
    enqueue_unsubscribe,
)
from services.upload.sync.models import (
    PENDING_RETRY,
    SYNCED,
    TOMBSTONED,
    linked_drives,
    synced_items,
    utcnow,
)
from services.upload.sync.sync_job import job_context

_STATUS = {
    SYNCED: sync_pb2.SYNC_ITEM_STATUS_SYNCED,
    PENDING_RETRY: sync_pb2.SYNC_ITEM_STATUS_PENDING_RETRY,
    TOMBSTONED: sync_pb2.SYNC_ITEM_STATUS_TOMBSTONED,
}
MAX_ID = 255


def _ts(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def _required(field: str, value: str, limit: int = MAX_ID) -> str:
    value = value.strip()
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > limit:
        raise InvalidArgument(field, f"is longer than {limit} characters")
    return value


def item_message(row: RowMapping) -> sync_pb2.SyncedItem:
    """A SyncedItem message from a row."""
    return sync_pb2.SyncedItem(
        synced_item_id=row["id"],
        account_id=row["account_id"],
        upstream_drive_id=row["upstream_drive_id"],
        upstream_item_id=row["upstream_item_id"],
        file_id=row["file_id"] or "",
        linked_drive_id=row["drive_id"] or "",
        status=_STATUS.get(row["status"], sync_pb2.SYNC_ITEM_STATUS_UNSPECIFIED),
        name=row["name"],
        size=row["size"],
        expires_at=_ts(row["expires_at"]),
        tombstoned_at=_ts(row["tombstoned_at"]),
        tombstone_reason=row["tombstone_reason"] or "",
        retry_count=row["retry_count"],
        last_status_code=row["last_status_code"] or 0,
        last_error=row["last_error"] or "",
        last_synced_at=_ts(row["last_synced_at"]),
        next_retry_at=_ts(row["next_retry_at"]),
    )


async def drive_message(session: AsyncSession, row: RowMapping) -> sync_pb2.LinkedDrive:
    """A LinkedDrive message with its items counted by status."""
    counts: dict[str, int] = dict(
        (
            await session.execute(
                select(synced_items.c.status, func.count())
                .where(synced_items.c.drive_id == row["id"])
                .group_by(synced_items.c.status)
            )
        ).all()
    )
    return sync_pb2.LinkedDrive(
        linked_drive_id=row["id"],
        account_id=row["account_id"],
        upstream_drive_id=row["upstream_drive_id"],
        folder_id=row["folder_id"] or "",
        has_delta_cursor=row["delta_link"] is not None,
        last_delta_at=_ts(row["last_delta_at"]),
        last_full_resync_at=_ts(row["last_full_resync_at"]),
        full_resync_count=row["full_resync_count"],
        synced_count=counts.get(SYNCED, 0),
        pending_retry_count=counts.get(PENDING_RETRY, 0),
        tombstoned_count=counts.get(TOMBSTONED, 0),
    )


class SyncServicer(sync_pb2_grpc.SyncServiceServicer):
    """Link, unlink, trigger and inspect upstream sync; every call is tenant-scoped."""

    def __init__(self, engine: SyncEngine, authenticator: Authenticator) -> None:
        self.engine = engine
        self.auth = authenticator

    async def _item(self, session: AsyncSession, who: Identity, item_id: str) -> RowMapping:
        row = await items.load_item(session, _required("synced_item_id", item_id, 32))
        if row is None or row["tenant_id"] != who.tenant_id:
            raise SyncedItemNotFound(f"synced item {item_id} not found", synced_item_id=item_id)
        return row

    def _require_provider(self, who: Identity) -> None:
        """FAILED_PRECONDITION unless the caller's tenant has a provider credential."""
        if not self.engine.settings.provider_configured(who.tenant_id):
            raise SyncProviderNotConfigured(
                "no upstream provider credential is configured for this tenant",
                tenant_id=who.tenant_id,
            )

    async def _drive(self, session: AsyncSession, who: Identity, drive_id: str) -> RowMapping:
        row = await items.load_drive(session, _required("linked_drive_id", drive_id, 32))
        if row is None or row["tenant_id"] != who.tenant_id:
            raise LinkedDriveNotFound(f"drive {drive_id} not linked", linked_drive_id=drive_id)
        return row

    async def LinkItem(
        self, request: sync_pb2.LinkItemRequest, context: grpc.aio.ServicerContext
    ) -> sync_pb2.SyncedItem:
        """Create the synced item and queue its first sync, in one transaction."""
        who = self.auth.require_user(context)
        account = _required("account_id", request.account_id, 128)
        drive = _required("upstream_drive_id", request.upstream_drive_id)
        upstream = _required("upstream_item_id", request.upstream_item_id)
        file_id = request.file_id.strip() or None
        if file_id is not None and len(file_id) > 32:
            raise InvalidArgument("file_id", "is longer than 32 characters")
        self._require_provider(who)
        try:
            async with self.engine.sessions() as session, session.begin():
                if file_id is not None:
                    # Backing a file with upstream content changes it: write access needed.
                    await permissions.writable(session, who, file_id)
                item_id = await items.insert_item(
                    session,
                    tenant_id=who.tenant_id,
                    account_id=account,
                    upstream_drive_id=drive,
                    upstream_item_id=upstream,
                    file_id=file_id,
                    now=utcnow(),
                )
                row = await items.load_item(session, item_id)
                assert row is not None
                await enqueue_item_sync(session, item_id, reason="link", context=job_context(row))
        except IntegrityError as exc:
            raise AlreadyExists(
                f"upstream item {upstream} is already linked",
                reason="SYNCED_ITEM_EXISTS",
                upstream_item_id=upstream,
            ) from exc
        return item_message(row)

    async def UnlinkItem(
        self, request: sync_pb2.UnlinkItemRequest, context: grpc.aio.ServicerContext
    ) -> sync_pb2.UnlinkItemResponse:
        """Forget a live item; a tombstone stays (its file must stay hidden) until purge."""
        who = self.auth.require_user(context)
        async with self.engine.sessions() as session, session.begin():
            row = await self._item(session, who, request.synced_item_id)
            if row["status"] == TOMBSTONED:
                raise FileRetentionExpired(
                    "a tombstoned item is kept until purge",
                    status="expired",
                    file_id=row["file_id"],
                )
            await session.execute(delete(synced_items).where(synced_items.c.id == row["id"]))
        return sync_pb2.UnlinkItemResponse()

    async def LinkDrive(
        self, request: sync_pb2.LinkDriveRequest, context: grpc.aio.ServicerContext
    ) -> sync_pb2.LinkedDrive:
        """Link a drive and queue its first (full) delta poll."""
        who = self.auth.require_user(context)
        account = _required("account_id", request.account_id, 128)
        upstream = _required("upstream_drive_id", request.upstream_drive_id)
        folder = request.folder_id.strip() or None
        if folder is not None and len(folder) > 32:
            raise InvalidArgument("folder_id", "is longer than 32 characters")
        self._require_provider(who)
        now = utcnow()
        drive_id = items.new_id()
        try:
            async with self.engine.sessions() as session, session.begin():
                owner = who.user_id
                if folder is not None:
                    # Mirroring a drive into a folder writes into it: write access needed.
                    target, _ = await permissions.writable(session, who, folder)
                    if target.kind != FOLDER:
                        raise WrongKind("folder_id is not a folder", file_id=folder)
                    # Files the delta discovers belong to the folder's owner (as an
                    # upload's new file does): an editor's link fills the owner's tree.
                    owner = target.owner_user_id
                await session.execute(
                    insert(linked_drives).values(
                        id=drive_id,
                        tenant_id=who.tenant_id,
                        account_id=account,
                        upstream_drive_id=upstream,
                        folder_id=folder,
                        owner_user_id=owner,
                        linked_by=who.user_id,
                        full_resync_count=0,
                        created_at=now,
                        updated_at=now,
                    )
                )
                await enqueue_delta_poll(
                    session,
                    drive_id,
                    reason="link",
                    dedupe_window_seconds=self.engine.settings.webhook_dedupe_seconds,
                )
                if self.engine.settings.subscriptions_enabled:
                    # Subscribe now rather than at the next periodic check.
                    await enqueue_subscription(
                        session,
                        drive_id,
                        action=ENSURE,
                        reason="link",
                        dedupe_window_seconds=self.engine.settings.webhook_dedupe_seconds,
                    )
                row = await items.load_drive(session, drive_id)
                assert row is not None
                return await drive_message(session, row)
        except IntegrityError as exc:
            raise AlreadyExists(
                f"drive {upstream} is already linked",
                reason="LINKED_DRIVE_EXISTS",
                upstream_drive_id=upstream,
            ) from exc

    async def UnlinkDrive(
        self, request: sync_pb2.UnlinkDriveRequest, context: grpc.aio.ServicerContext
    ) -> sync_pb2.UnlinkDriveResponse:
        """Stop polling a drive; its live items are forgotten, its tombstones kept."""
        who = self.auth.require_user(context)
        async with self.engine.sessions() as session, session.begin():
            row = await self._drive(session, who, request.linked_drive_id)
            await session.execute(
                delete(synced_items).where(
                    synced_items.c.drive_id == row["id"], synced_items.c.status != TOMBSTONED
                )
            )
            await session.execute(delete(linked_drives).where(linked_drives.c.id == row["id"]))
            if row["subscription_id"]:
                # Stop the provider posting for a link that is gone (a job: it may fail).
                await enqueue_unsubscribe(session, row["tenant_id"], row["subscription_id"])
        return sync_pb2.UnlinkDriveResponse()

    async def TriggerSync(
        self, request: sync_pb2.TriggerSyncRequest, context: grpc.aio.ServicerContext
    ) -> sync_pb2.TriggerSyncResponse:
        """Queue an item sync or a drive delta poll; a tombstone is never synced again."""
        who = self.auth.require_user(context)
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidArgument("target", "set synced_item_id or linked_drive_id")
        self._require_provider(who)
        async with self.engine.sessions() as session, session.begin():
            if target == "synced_item_id":
                row = await self._item(session, who, request.synced_item_id)
                if row["status"] == TOMBSTONED:
                    return sync_pb2.TriggerSyncResponse(queued=False)
                job_id = await enqueue_item_sync(
                    session, row["id"], reason="trigger", context=job_context(row)
                )
            elif target == "linked_drive_id":
                drive = await self._drive(session, who, request.linked_drive_id)
                job_id = await enqueue_delta_poll(
                    session,
                    drive["id"],
                    reason="trigger",
                    dedupe_window_seconds=self.engine.settings.webhook_dedupe_seconds,
                )
            else:
                raise InvalidArgument("target", "set synced_item_id or linked_drive_id")
        return sync_pb2.TriggerSyncResponse(job_id=job_id, queued=True)

    async def GetSyncStatus(
        self, request: sync_pb2.GetSyncStatusRequest, context: grpc.aio.ServicerContext
    ) -> sync_pb2.GetSyncStatusResponse:
        """An item's (by id or file id) or a drive's sync state."""
        who = self.auth.require_user(context)
        target = request.WhichOneof("target")
        async with self.engine.sessions() as session:
            if target == "synced_item_id":
                row = await self._item(session, who, request.synced_item_id)
                return sync_pb2.GetSyncStatusResponse(item=item_message(row))
            if target == "file_id":
                file_id = _required("file_id", request.file_id, 32)
                found = (
                    (
                        await session.execute(
                            select(synced_items).where(
                                synced_items.c.file_id == file_id,
                                synced_items.c.tenant_id == who.tenant_id,
                            )
                        )
                    )
                    .mappings()
                    .first()
                )
                if found is None:
                    raise SyncedItemNotFound(f"file {file_id} is not synced", file_id=file_id)
                return sync_pb2.GetSyncStatusResponse(item=item_message(found))
            if target == "linked_drive_id":
                drive = await self._drive(session, who, request.linked_drive_id)
                return sync_pb2.GetSyncStatusResponse(drive=await drive_message(session, drive))
        raise InvalidArgument("target", "set synced_item_id, linked_drive_id or file_id")
