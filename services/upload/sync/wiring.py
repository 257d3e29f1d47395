"""Hook the sync engine into the upload service: job types, schedules, servicer, webhooks.

`services/upload/app.py` calls `wire_sync(...)` once and adds what it returns to its
`ServiceApp`, `JobRegistry` and `PeriodicScheduler`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from serentak.upload.v1 import sync_pb2, sync_pb2_grpc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Authenticator
from services.common.grpc_server import Servicer
from services.common.jobs.periodic import PeriodicSchedule
from services.common.jobs.registry import JobRegistry
from services.upload.sync.cache import LocalByteCache
from services.upload.sync.delta import delta_handler
from services.upload.sync.engine import RetireFiles, SyncEngine
from services.upload.sync.graph import GraphProvider
from services.upload.sync.jobs import (
    DELTA_JOB,
    ITEM_JOB,
    PURGE_JOB,
    RECONCILE_JOB,
    SUBSCRIPTION_JOB,
    SUBSCRIPTIONS_JOB,
    UNSUBSCRIBE_JOB,
    periodic_schedules,
    transient_policy,
)
from services.upload.sync.purge import purge_handler
from services.upload.sync.reconcile import reconcile_handler
from services.upload.sync.servicer import SyncServicer
from services.upload.sync.settings import DEV_CLIENT_STATE, SyncSettings
from services.upload.sync.subscriptions import (
    subscription_handler,
    subscriptions_handler,
    unsubscribe_handler,
)
from services.upload.sync.sync_job import item_handler
from services.upload.sync.webhooks import WebhookServer


def register_sync_jobs(registry: JobRegistry, engine: SyncEngine) -> None:
    """Register the sync job types on the upload service's registry."""
    policy = transient_policy(engine.settings)
    registry.register(ITEM_JOB, item_handler(engine), retry=policy)
    registry.register(
        DELTA_JOB,
        delta_handler(engine),
        retry=policy,
        dedupe_window_seconds=engine.settings.webhook_dedupe_seconds,
    )
    registry.register(RECONCILE_JOB, reconcile_handler(engine), retry=policy)
    registry.register(PURGE_JOB, purge_handler(engine), retry=policy)
    registry.register(SUBSCRIPTION_JOB, subscription_handler(engine), retry=policy)
    registry.register(SUBSCRIPTIONS_JOB, subscriptions_handler(engine), retry=policy)
    registry.register(UNSUBSCRIBE_JOB, unsubscribe_handler(engine), retry=policy)


class InsecureSyncSettings(ValueError):
    """Sync settings the service refuses to start with."""


def check_settings(settings: SyncSettings, auth_mode: str) -> None:
    """Refuse a webhook secret anyone could know: empty, or the default outside dev mode."""
    if not settings.enabled:
        return
    if not settings.client_state:
        raise InsecureSyncSettings("SERENTAK_SYNC_CLIENT_STATE must not be empty")
    if settings.client_state == DEV_CLIENT_STATE and auth_mode != "dev":
        raise InsecureSyncSettings(
            "SERENTAK_SYNC_CLIENT_STATE is the published dev default; set a secret "
            "(or SERENTAK_SYNC_ENABLED=false) outside SERENTAK_AUTH_MODE=dev"
        )


@dataclass(frozen=True, slots=True)
class SyncWiring:
    """What the upload service's app adds for upstream sync."""

    engine: SyncEngine
    servicer: Servicer
    schedules: list[PeriodicSchedule]
    # ServiceApp.background: serves the webhook endpoint until cancelled.
    webhook_server: Callable[[], Awaitable[None]]
    # ServiceApp.on_shutdown: closes the provider's HTTP connections.
    close: Callable[[], Awaitable[None]]


def wire_sync(
    settings: SyncSettings,
    sessions: async_sessionmaker[AsyncSession],
    registry: JobRegistry,
    authenticator: Authenticator,
    cache_root: Path,
    retire_files: RetireFiles | None = None,
    *,
    auth_mode: str = "dev",
) -> SyncWiring:
    """Build the engine, register its jobs, and return the pieces for the ServiceApp.

    Raises InsecureSyncSettings (the service does not start) on a guessable clientState.
    """
    check_settings(settings, auth_mode)
    provider = GraphProvider(
        settings.provider_base_url,
        {tenant: token.get_secret_value() for tenant, token in settings.provider_tokens.items()},
        timeout_seconds=settings.provider_timeout_seconds,
    )
    engine = SyncEngine(
        settings=settings,
        sessions=sessions,
        provider=provider,
        cache=LocalByteCache(cache_root),
        retire_files=retire_files,
    )
    register_sync_jobs(registry, engine)

    async def serve_webhooks() -> None:
        server = WebhookServer(engine)
        await server.start()
        try:
            await asyncio.Event().wait()  # until the service cancels us at shutdown
        finally:
            await server.stop()

    servicer = Servicer(
        sync_pb2_grpc.add_SyncServiceServicer_to_server,
        SyncServicer(engine, authenticator),
        sync_pb2.DESCRIPTOR.services_by_name["SyncService"].full_name,
    )
    return SyncWiring(
        engine=engine,
        servicer=servicer,
        schedules=periodic_schedules(settings),
        webhook_server=serve_webhooks,
        close=provider.aclose,
    )
