"""gRPC surface of `serentak.notify.v1.NotifyService`.

Identity: Ingest and IngestBatch take the service credential only; every other RPC acts
for the calling user and sees only that user's notifications (tenant and user from the
bearer token).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Authenticator
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.common.logging import get_logger
from services.notify import cursors, reading
from services.notify.inbox import Inbox
from services.notify.messages import to_message
from services.notify.settings import NotifySettings
from services.notify.sql import retrying
from services.notify.streams import StreamReader

log = get_logger(__name__)
MAX_DEVICE_ID = 128
# Largest SubscribeRequest.max_batch: 64 of the largest notifications the columns can hold
# (~16 KiB each) are ~1 MiB, well inside a client's default 4 MiB receive limit.
MAX_SUBSCRIBE_BATCH = 64


class NotifyServicer(notify_pb2_grpc.NotifyServiceServicer):
    """Ingest, reading and Subscribe, each checked against the caller's identity."""

    def __init__(
        self,
        settings: NotifySettings,
        auth: Authenticator,
        sessions: async_sessionmaker[AsyncSession],
        inbox: Inbox,
        streams: StreamReader,
    ) -> None:
        self._settings = settings
        self._auth = auth
        self._sessions = sessions
        self._inbox = inbox
        self._streams = streams

    async def Ingest(
        self, request: notify_pb2.IngestRequest, context: grpc.aio.ServicerContext
    ) -> notify_pb2.IngestResponse:
        """Idempotent by event_id; applies events per aggregate in version order."""
        # Only the principals that publish events (the upload service): anyone else could
        # forge a notification into any tenant's inbox.
        self._auth.require_service(context, self._settings.ingest_principals)
        if not request.HasField("event"):
            raise InvalidArgument("event", "required", reason="INVALID_EVENT")
        result = await self._inbox.ingest(request.event)
        return notify_pb2.IngestResponse(
            duplicate=result.outcome == notify_pb2.INGEST_OUTCOME_DUPLICATE,
            outcome=result.outcome,  # type: ignore[arg-type]
            notifications_written=result.scheduled,
        )

    async def IngestBatch(
        self, request: notify_pb2.IngestBatchRequest, context: grpc.aio.ServicerContext
    ) -> notify_pb2.IngestBatchResponse:
        """Ingest for each event, in order, in one transaction (the relay's batches)."""
        self._auth.require_service(context, self._settings.ingest_principals)
        if not request.events:
            raise InvalidArgument("events", "required", reason="INVALID_EVENT")
        if len(request.events) > self._settings.ingest_batch_max:
            raise InvalidArgument(
                "events",
                f"more than {self._settings.ingest_batch_max} events",
                reason="INVALID_EVENT",
            )
        results = await self._inbox.ingest_many(list(request.events))
        return notify_pb2.IngestBatchResponse(
            results=[
                notify_pb2.IngestResponse(
                    duplicate=r.outcome == notify_pb2.INGEST_OUTCOME_DUPLICATE,
                    outcome=r.outcome,  # type: ignore[arg-type]
                    notifications_written=r.scheduled,
                )
                for r in results
            ]
        )

    async def ListNotifications(
        self, request: notify_pb2.ListNotificationsRequest, context: grpc.aio.ServicerContext
    ) -> notify_pb2.ListNotificationsResponse:
        """The caller's notifications, newest first, one page at a time."""
        identity = self._auth.require_user(context)
        if request.page_size < 0:
            raise InvalidArgument("page_size", "must be >= 0")
        size = min(
            request.page_size or self._settings.default_page_size, self._settings.max_page_size
        )
        before = cursors.decode("page_token", request.page_token) if request.page_token else None

        async def read() -> reading.Page:
            async with self._sessions() as session:
                await read_only(session)  # a snapshot: no write lock on SQLite
                return await reading.list_page(
                    session,
                    identity,
                    page_size=size,
                    before_seq=before,
                    unread_only=request.unread_only,
                )

        page = await retrying(read)
        return notify_pb2.ListNotificationsResponse(
            notifications=[to_message(row) for row in page.rows],
            next_page_token=cursors.encode(page.next_before)
            if page.next_before is not None
            else "",
        )

    async def MarkRead(
        self, request: notify_pb2.MarkReadRequest, context: grpc.aio.ServicerContext
    ) -> notify_pb2.MarkReadResponse:
        """Mark by ids and/or everything at or before a cursor; returns the new badge."""
        identity = self._auth.require_user(context)
        ids = reading.check_notification_ids(request.notification_ids)
        up_to = (
            cursors.decode("up_to_cursor", request.up_to_cursor) if request.up_to_cursor else None
        )
        if not ids and up_to is None:
            raise InvalidArgument("notification_ids", "give notification_ids or up_to_cursor")

        async def mark() -> tuple[int, int]:
            async with self._sessions() as session, session.begin():
                marked = await reading.mark_read(
                    session, identity, notification_ids=ids, up_to_seq=up_to
                )
                return marked, await reading.unread_count(session, identity)

        marked, unread = await retrying(mark)
        return notify_pb2.MarkReadResponse(marked=marked, unread_count=unread)

    async def GetUnreadCount(
        self, request: notify_pb2.GetUnreadCountRequest, context: grpc.aio.ServicerContext
    ) -> notify_pb2.GetUnreadCountResponse:
        """The caller's badge."""
        identity = self._auth.require_user(context)

        async def count() -> int:
            async with self._sessions() as session:
                await read_only(session)
                return await reading.unread_count(session, identity)

        unread = await retrying(count)
        return notify_pb2.GetUnreadCountResponse(unread_count=unread)

    async def Subscribe(
        self, request: notify_pb2.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[notify_pb2.SubscribeResponse]:
        """Replay after the cursor, then live notifications, until the client leaves."""
        identity = self._auth.require_user(context)
        after = cursors.decode("cursor", request.cursor) if request.cursor else None
        if len(request.device_id) > MAX_DEVICE_ID:
            raise InvalidArgument("device_id", f"longer than {MAX_DEVICE_ID} characters")
        if request.max_batch > MAX_SUBSCRIBE_BATCH:
            raise InvalidArgument("max_batch", f"at most {MAX_SUBSCRIBE_BATCH}")
        log.info("stream_opened", user_id=identity.user_id, device_id=request.device_id)
        async for response in self._streams.subscribe(
            identity.tenant_id,
            identity.user_id,
            after,
            request.device_id,
            max_batch=request.max_batch,
        ):
            yield response
