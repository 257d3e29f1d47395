"""The provider's webhook endpoint (aiohttp, in the upload service's process).

- Validation handshake: `?validationToken=...` (at most MAX_VALIDATION_TOKEN characters)
  is echoed back as text/plain, 200, and nothing else happens: the body of such a request
  is never read, so a token cannot carry a notification past the clientState check.
- Every response, errors included, carries `X-Content-Type-Options: nosniff` (the echo
  is caller-chosen text: no browser may sniff it into HTML).
- Bodies that are not a JSON object (malformed, too deep, wrong shape) are 400, never 500.
- Every entry must be authentic (`notifications.py`: the clientState of the drive link
  its subscription names, or the shared secret for a subscription we do not know), else
  the batch is 403 and nothing is queued. The body is never trusted as state.
- Change notifications (`webhook_path`) only name drives: each gets a delta poll with
  dedupe_key `delta:{drive_id}`, so duplicates and bursts collapse into one poll.
- Lifecycle notifications (`webhook_lifecycle_path`) act on the one drive link their
  subscription belongs to (so only in its tenant): `subscriptionRemoved` recreates the
  subscription and queues a full re-enumeration, `missed` a delta poll,
  `reauthorizationRequired` a renewal; any other event is counted and ignored.
Both answer 202 quickly.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web
from sqlalchemy import select
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.logging import get_logger
from services.upload.sync import metrics
from services.upload.sync.engine import SyncEngine
from services.upload.sync.graph import drive_of
from services.upload.sync.jobs import (
    RECREATE,
    RENEW,
    enqueue_delta_poll,
    enqueue_subscription,
)
from services.upload.sync.models import linked_drives
from services.upload.sync.notifications import (
    LIFECYCLE_EVENTS,
    Entry,
    authenticate,
    read_entries,
)
from services.upload.sync.provider import WebhookRefused

log = get_logger(__name__)

MAX_BODY_BYTES = 1024 * 1024
# Graph's tokens are well under this; a longer one is not a handshake.
MAX_VALIDATION_TOKEN = 1024


async def _nosniff(request: web.Request, response: web.StreamResponse) -> None:
    """On every response the app prepares (handler answers and aiohttp's own 404/405/413)."""
    response.headers["X-Content-Type-Options"] = "nosniff"


def _refused(exc: WebhookRefused) -> web.Response:
    """A 4xx for a notification that must not be acted on (counted and logged)."""
    metrics.WEBHOOK_DELIVERIES.labels("refused" if exc.status == 403 else "invalid").inc()
    log.warning("sync_webhook_refused", status=exc.status, error=str(exc))
    return web.Response(status=exc.status, text=str(exc))


def _handshake(request: web.Request) -> web.Response | None:
    """The validation handshake's answer, if this is one (the body is never read)."""
    token = request.query.get("validationToken")
    if token is None:
        return None
    if not token or len(token) > MAX_VALIDATION_TOKEN:
        metrics.WEBHOOK_DELIVERIES.labels("invalid").inc()
        return web.Response(status=400, text="validationToken is empty or too long")
    metrics.WEBHOOK_DELIVERIES.labels("validated").inc()
    return web.Response(text=token, content_type="text/plain")


async def _read(request: web.Request, *, lifecycle: bool) -> list[Entry]:
    """The body's entries; WebhookRefused(400) for anything but a well-formed batch."""
    try:
        payload = json.loads(await request.read())
    except RecursionError as exc:
        # json's C scanner gave up on a deeply nested body: bad input.
        raise WebhookRefused("body is nested too deeply") from exc
    except ValueError as exc:
        raise WebhookRefused(f"body is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise WebhookRefused("body is not a JSON object")
    return read_entries(payload, lifecycle=lifecycle)


async def _on_changes(
    engine: SyncEngine, session: AsyncSession, found: list[tuple[Entry, RowMapping | None]]
) -> int:
    """Queue delta polls for the drives a change batch names; how many drives."""
    drive_ids = {drive["id"] for _, drive in found if drive is not None}
    upstream = {drive_of(e.resource) for e, drive in found if drive is None}
    if upstream:
        # Shared-secret entries (subscriptions made elsewhere): every link of the drive.
        drive_ids.update(
            (
                await session.execute(
                    select(linked_drives.c.id).where(
                        linked_drives.c.upstream_drive_id.in_(upstream)
                    )
                )
            ).scalars()
        )
    for drive_id in sorted(drive_ids):
        await enqueue_delta_poll(
            session,
            drive_id,
            reason="webhook",
            dedupe_window_seconds=engine.settings.webhook_dedupe_seconds,
        )
    return len(drive_ids)


async def _on_lifecycle(
    engine: SyncEngine, session: AsyncSession, found: list[tuple[Entry, RowMapping | None]]
) -> int:
    """Act on lifecycle events of our own subscriptions; how many were acted on."""
    window = engine.settings.webhook_dedupe_seconds
    acted = 0
    for entry, drive in found:
        event = entry.lifecycle_event
        metrics.LIFECYCLE_EVENTS.labels(event if event in LIFECYCLE_EVENTS else "other").inc()
        log.info(
            "sync_lifecycle_event",
            lifecycle_event=event[:64],
            drive_id=drive["id"] if drive is not None else None,
        )
        if drive is None or event not in LIFECYCLE_EVENTS:
            continue  # not a subscription of ours, or an event we do not know
        acted += 1
        if event == "subscriptionRemoved":
            await enqueue_subscription(
                session, drive["id"], action=RECREATE, reason=event, dedupe_window_seconds=window
            )
            # Notifications may have been lost while there was none: enumerate everything.
            await enqueue_delta_poll(
                session, drive["id"], reason=event, dedupe_window_seconds=window, full=True
            )
        elif event == "missed":
            await enqueue_delta_poll(
                session, drive["id"], reason=event, dedupe_window_seconds=window
            )
        else:  # reauthorizationRequired: renewing with our credential reauthorizes it
            await enqueue_subscription(
                session, drive["id"], action=RENEW, reason=event, dedupe_window_seconds=window
            )
    return acted


def webhook_app(engine: SyncEngine) -> web.Application:
    """The aiohttp application serving `webhook_path` and `webhook_lifecycle_path`."""

    def endpoint(lifecycle: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            handshake = _handshake(request)
            if handshake is not None:
                return handshake
            try:
                entries = await _read(request, lifecycle=lifecycle)
                async with engine.sessions() as session, session.begin():
                    found = await authenticate(session, entries, engine.settings.client_state)
                    act = _on_lifecycle if lifecycle else _on_changes
                    count = await act(engine, session, found)
            except WebhookRefused as exc:
                return _refused(exc)
            metrics.WEBHOOK_DELIVERIES.labels("accepted" if count else "unknown_drive").inc()
            log.info("sync_webhook_accepted", lifecycle=lifecycle, drives=count)
            return web.Response(status=202)

        return handle

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.on_response_prepare.append(_nosniff)
    app.router.add_post(engine.settings.webhook_path, endpoint(lifecycle=False))
    app.router.add_post(engine.settings.webhook_lifecycle_path, endpoint(lifecycle=True))
    return app


class WebhookServer:
    """Runs `webhook_app` on host:port; `port` is the bound one after `start()`."""

    def __init__(self, engine: SyncEngine, *, host: str | None = None, port: int | None = None):
        self.host = host if host is not None else engine.settings.webhook_host
        self.port = port if port is not None else engine.settings.webhook_port
        self._runner = web.AppRunner(webhook_app(engine), access_log=None)

    async def start(self) -> None:
        """Bind and serve (port 0: any free port, read back into `self.port`)."""
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        # aiohttp exposes the bound socket (needed with port 0) only on the private server.
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("sync_webhook_listening", host=self.host, port=self.port)

    async def stop(self) -> None:
        """Stop accepting and close connections."""
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        """Where the provider should post (for subscriptions and tests)."""
        return f"http://{self.host}:{self.port}"
