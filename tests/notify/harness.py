"""Helpers for the notify tests: events as the relay sends them, a harness around the
running service, error reasons."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from support.grpc_errors import error_info
from support.services import running_app

from services.common.config import DEFAULT_AUTH_TOKENS
from services.common.grpc_server import RunningService
from services.notify.app import build_app
from services.notify.components import NotifyComponents, build_components
from services.notify.fanout_job import FANOUT_JOB
from services.notify.settings import NotifySettings

# The relay calls Ingest as the upload principal; admin RPCs need the ops role.
SERVICE = (("authorization", "Bearer dev-service-upload"),)
OPS = (("authorization", "Bearer dev-ops"),)
SETTLE_DEADLINE_S = 60.0
_versions = itertools.count(1)


def user_md(user: str) -> tuple[tuple[str, str], ...]:
    """Call metadata for a dev user token (dev-alice, ...) or a generated `tok-<user>`."""
    token = f"dev-{user}" if f"dev-{user}" in DEFAULT_AUTH_TOKENS else f"tok-{user}"
    return (("authorization", f"Bearer {token}"),)


def event(
    file_id: str,
    version: int,
    *,
    kind: str = "content",
    name: str = "report.pdf",
    actor: str = "carol",
    audience: Iterable[str] = ("alice", "bob", "carol"),
    dedupe_key: str | None = None,
    occurred_at: datetime | None = None,
    tenant: str = "acme",
    event_id: str | None = None,
) -> events_pb2.Event:
    """A file event as the upload service's relay would send it."""
    ts = Timestamp()
    ts.FromDatetime(occurred_at or datetime.now(UTC))
    ev = events_pb2.Event(
        event_id=event_id or uuid.uuid4().hex,
        aggregate_type="file",
        aggregate_id=file_id,
        tenant_id=tenant,
        actor_user_id=actor,
        version=version,
        occurred_at=ts,
        audience_user_ids=list(audience),
        correlation_id=uuid.uuid4().hex,
    )
    if kind == "content":
        ev.event_type = "file.content.updated"
        ev.dedupe_key = dedupe_key if dedupe_key is not None else f"file:{file_id}:content"
        ev.file_content_updated.CopyFrom(events_pb2.FileContentUpdated(file_id=file_id, name=name))
    elif kind == "rename":
        ev.event_type = "file.renamed"
        ev.dedupe_key = dedupe_key if dedupe_key is not None else f"file:{file_id}:rename"
        ev.file_renamed.CopyFrom(events_pb2.FileRenamed(file_id=file_id, new_name=name))
    elif kind == "purged":
        # The terminal event the upload service's purge writes (audience: nobody).
        ev.event_type = "file.purged"
        ev.dedupe_key = dedupe_key if dedupe_key is not None else f"file:{file_id}:purged"
        ev.file_purged.CopyFrom(events_pb2.FilePurged(file_id=file_id))
    else:
        raise ValueError(kind)
    return ev


async def read_stream(
    call: grpc.aio.UnaryStreamCall, total: int, label: str = "stream"
) -> list[notify_pb2.Notification]:
    """The first `total` notifications of an open Subscribe `call` (one per message),
    then the call cancelled; fails if it ends first or one takes a minute."""
    got: list[notify_pb2.Notification] = []
    try:
        while len(got) < total:
            item = await asyncio.wait_for(call.read(), SETTLE_DEADLINE_S)
            assert item is not grpc.aio.EOF, f"{label}: stream ended after {len(got)}"
            got.append(item.notification)
    finally:
        call.cancel()
    return got


def error_reason(err: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a failed call (fails the test when there is none)."""
    return error_info(err).reason


@dataclass
class NotifyHarness:
    """The running service plus a stub and a few helpers."""

    service: RunningService
    stub: notify_pb2_grpc.NotifyServiceStub
    admin: admin_pb2_grpc.AdminServiceStub
    settings: NotifySettings
    parts: NotifyComponents

    async def fanout_backlog(self) -> tuple[int, int]:
        """(queued or running fan-out jobs, dead-lettered ones), from AdminService."""
        stats = await self.admin.QueueStats(admin_pb2.QueueStatsRequest(), metadata=OPS)
        for t in stats.job_types:
            if t.job_type == FANOUT_JOB:
                return t.queued + t.running, t.dead_letters
        return 0, 0

    async def settled(self) -> None:
        """Wait until every accepted event's fan-out job has finished (none queued or
        running), polling the queue stats with a deadline; fails on a dead letter."""
        deadline = asyncio.get_running_loop().time() + SETTLE_DEADLINE_S
        while True:
            backlog, dead = await self.fanout_backlog()
            assert dead == 0, "a fan-out job was dead-lettered"
            if backlog == 0:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{backlog} fan-out jobs still pending")
            self.parts.runtime.wake()
            await asyncio.sleep(0.05)  # poll interval of the wait above, not a stand-in

    async def ingest_settled(self, ev: events_pb2.Event) -> notify_pb2.IngestResponse:
        """Ingest, then wait until its fan-out (if accepted) has been written."""
        resp = await self.ingest(ev)
        await self.settled()
        return resp

    async def ingest(self, ev: events_pb2.Event) -> notify_pb2.IngestResponse:
        return await self.stub.Ingest(notify_pb2.IngestRequest(event=ev), metadata=SERVICE)

    async def ingest_all(self, events: Iterable[events_pb2.Event], parallel: int = 16) -> list[Any]:
        """Ingest concurrently (at most `parallel` calls in flight), results in input order."""
        gate = asyncio.Semaphore(parallel)

        async def one(ev: events_pb2.Event) -> notify_pb2.IngestResponse:
            async with gate:
                return await self.ingest(ev)

        return await asyncio.gather(*(one(ev) for ev in events))

    async def all_notifications(
        self, user: str, unread_only: bool = False
    ) -> list[notify_pb2.Notification]:
        """Every notification of `user`, newest first, following page tokens."""
        out: list[notify_pb2.Notification] = []
        token = ""
        while True:
            page = await self.stub.ListNotifications(
                notify_pb2.ListNotificationsRequest(
                    page_size=500, page_token=token, unread_only=unread_only
                ),
                metadata=user_md(user),
            )
            out.extend(page.notifications)
            token = page.next_page_token
            if not token:
                return out

    async def unread(self, user: str) -> int:
        resp = await self.stub.GetUnreadCount(
            notify_pb2.GetUnreadCountRequest(), metadata=user_md(user)
        )
        return resp.unread_count


async def _start(settings: NotifySettings) -> AsyncIterator[NotifyHarness]:
    parts = build_components(settings)
    async with running_app(build_app(settings, parts)) as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.app.bound_port}") as channel:
            yield NotifyHarness(
                service,
                notify_pb2_grpc.NotifyServiceStub(channel),
                admin_pb2_grpc.AdminServiceStub(channel),
                settings,
                parts,
            )


start_notify = contextlib.asynccontextmanager(_start)
