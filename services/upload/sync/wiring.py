"""Hook the sync engine into the upload service: job types and periodic schedules."""

from __future__ import annotations

from services.common.jobs.registry import JobRegistry
from services.upload.sync.delta import delta_handler
from services.upload.sync.engine import SyncEngine
from services.upload.sync.jobs import (
    DELTA_JOB,
    ITEM_JOB,
    PURGE_JOB,
    RECONCILE_JOB,
    transient_policy,
)
from services.upload.sync.purge import purge_handler
from services.upload.sync.reconcile import reconcile_handler
from services.upload.sync.sync_job import item_handler


def register_sync_jobs(registry: JobRegistry, engine: SyncEngine) -> None:
    """Register the four sync job types on the upload service's registry."""
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
