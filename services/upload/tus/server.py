"""The tus endpoint's HTTP server, run by the upload service as a background task.

aiohttp, because it is already pinned here (the sync webhooks serve with it), serves on
the service's own asyncio loop beside `grpc.aio` (no second process, no thread: the use
cases and their database pools are shared as they are), and streams request bodies with
backpressure (`request.content`), which a PATCH of gigabytes needs. An ASGI stack
(uvicorn/hypercorn + a framework) would add two dependencies for the same.

With the service's TLS certificate configured (SERENTAK_TLS_CERT_FILE/KEY_FILE) it serves
HTTPS on it, renewed files picked up at each sweep; without, plain HTTP (`make run`).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from services.common.auth import Authenticator
from services.common.logging import get_logger
from services.common.rate_limits import RateGate
from services.common.tls import HttpsCertificate, server_tls
from services.upload.settings import UploadSettings
from services.upload.tus.http import tus_app
from services.upload.tus.resources import TusUploads

log = get_logger(__name__)


class TusServer:
    """Serves `tus_app` on bind_host:tus_port; `port` is the bound one once `started`."""

    def __init__(
        self,
        store: TusUploads,
        auth: Authenticator,
        rates: RateGate,
        settings: UploadSettings,
    ) -> None:
        self.store = store
        self.host = settings.bind_host
        self.port = settings.tus_port
        self.path = settings.tus_path
        self._sweep_seconds = settings.expiry_interval_seconds
        self._app = tus_app(
            store,
            auth,
            rates,
            base_path=settings.tus_path,
            cors_origins=settings.tus_cors_origins,
            lock_wait_seconds=settings.tus_lock_wait_seconds,
        )
        self.started = asyncio.Event()
        # HTTPS on the service's own certificate when it has one (nothing in the clear
        # outside `make run`); plain HTTP otherwise.
        tls = server_tls(settings)
        self._https = HttpsCertificate(tls) if tls is not None else None

    @property
    def url(self) -> str:
        """The creation URL (for clients and tests)."""
        scheme = "https" if self._https is not None else "http"
        return f"{scheme}://{self.host}:{self.port}{self.path}"

    async def serve(self) -> None:
        """Listen until cancelled (service shutdown), sweeping expired uploads meanwhile."""
        runner = web.AppRunner(self._app, access_log=None, handler_cancellation=False)
        await runner.setup()
        try:
            ssl_context = self._https.context if self._https is not None else None
            site = web.TCPSite(runner, self.host, self.port, ssl_context=ssl_context)
            await site.start()
            # aiohttp exposes the bound socket (needed with port 0) only on the private server.
            sockets = getattr(site._server, "sockets", None)
            if sockets:
                self.port = sockets[0].getsockname()[1]
            log.info("tus_listening", host=self.host, port=self.port, path=self.path)
            self.started.set()
            while True:
                await asyncio.sleep(self._sweep_seconds)  # the sweep's period, not a wait
                if self._https is not None:
                    self._https.refresh()  # a renewed certificate, for new connections
                try:
                    swept = await self.store.sweep()
                except Exception:
                    log.exception("tus_sweep_failed")
                else:
                    if swept:
                        log.info("tus_uploads_swept", count=swept)
        finally:
            await runner.cleanup()
            await self.store.close()
