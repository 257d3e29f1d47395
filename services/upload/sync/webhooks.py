"""The provider's webhook endpoint (aiohttp, in the upload service's process).

- Validation handshake: `?validationToken=...` (at most MAX_VALIDATION_TOKEN characters)
  is echoed back as text/plain, 200, and nothing else happens: the body of such a request
  is never read, so a token cannot carry a notification past the clientState check.
- Every response, errors included, carries `X-Content-Type-Options: nosniff` (the echo
  is caller-chosen text: no browser may sniff it into HTML).
- Bodies that are not a JSON object (malformed, too deep, wrong shape) are 400, never 500.
- Change notifications: every entry's `clientState` must equal the shared secret (else
  403, nothing queued). The body is never trusted as state: it only names drives, and
  each known drive gets a delta poll with dedupe_key `delta:{drive_id}`, so duplicates
  and bursts inside the window collapse into one poll. Answer 202 quickly.
"""

from __future__ import annotations

import json

from aiohttp import web
from sqlalchemy import select

from services.common.logging import get_logger
from services.upload.sync import metrics
from services.upload.sync.engine import SyncEngine
from services.upload.sync.jobs import enqueue_delta_poll
from services.upload.sync.models import linked_drives
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


def webhook_app(engine: SyncEngine) -> web.Application:
    """The aiohttp application serving `settings.webhook_path`."""

    async def notify(request: web.Request) -> web.Response:
        token = request.query.get("validationToken")
        if token is not None:
            if not token or len(token) > MAX_VALIDATION_TOKEN:
                metrics.WEBHOOK_DELIVERIES.labels("invalid").inc()
                return web.Response(status=400, text="validationToken is empty or too long")
            metrics.WEBHOOK_DELIVERIES.labels("validated").inc()
            return web.Response(text=token, content_type="text/plain")
        try:
            payload = json.loads(await request.read())
            if not isinstance(payload, dict):
                raise WebhookRefused("body is not a JSON object")
            upstream_drives = engine.provider.notified_drives(payload, engine.settings.client_state)
        except RecursionError:
            # json's C scanner (or a later walk) gave up on a deeply nested body: bad input.
            return _refused(WebhookRefused("body is nested too deeply"))
        except ValueError as exc:
            return _refused(WebhookRefused(f"body is not JSON: {exc}"))
        except WebhookRefused as exc:
            return _refused(exc)
        async with engine.sessions() as session, session.begin():
            drive_ids = (
                (
                    await session.execute(
                        select(linked_drives.c.id).where(
                            linked_drives.c.upstream_drive_id.in_(upstream_drives)
                        )
                    )
                )
                .scalars()
                .all()
            )
            for drive_id in drive_ids:
                await enqueue_delta_poll(
                    session,
                    drive_id,
                    reason="webhook",
                    dedupe_window_seconds=engine.settings.webhook_dedupe_seconds,
                )
        metrics.WEBHOOK_DELIVERIES.labels("accepted" if drive_ids else "unknown_drive").inc()
        log.info("sync_webhook_accepted", drives=len(drive_ids))
        return web.Response(status=202)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.on_response_prepare.append(_nosniff)
    app.router.add_post(engine.settings.webhook_path, notify)
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
