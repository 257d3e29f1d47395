"""The upload service's parts, built once from settings and wired together.

`app.py` turns these into a `ServiceApp`; tests build them directly to reach the job
runtime (e.g. to run a worker they can kill).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from services.common.auth import UPLOAD, Authenticator, build_authenticator, require_mode
from services.common.channels import service_client_security
from services.common.config import load
from services.common.db import create_engine, dispose_when_returned, is_sqlite, session_factory
from services.common.group_commit import GroupCommits
from services.common.jobs import JobRegistry, RetryPolicy
from services.common.jobs.runtime import JobRuntime, RuntimeOptions
from services.common.outbox import GrpcIngestSubscriber
from services.common.page_tokens import PageTokens
from services.common.rate_limits import Limiter, RateGate, database_store
from services.common.retention import register_runtime_retention
from services.upload import metrics
from services.upload.files.change_feed import ChangeFeed
from services.upload.files.change_log import (
    PURGE_CHANGES_JOB,
    purge_changes_handler,
    purge_changes_schedule,
)
from services.upload.files.change_waits import ChangeSignals
from services.upload.files.listing_cache import ListingCache
from services.upload.files.retire import retire_files
from services.upload.files.trash import PURGE_TRASH_JOB, purge_trash_handler, purge_trash_schedule
from services.upload.files.use_cases import Files
from services.upload.ingest.chunks import ChunkStore
from services.upload.ingest.expiry import EXPIRE_JOB, expiry_handler, expiry_schedule
from services.upload.ingest.finish_waits import FinishSignals, UploadWaits
from services.upload.ingest.uploads import Uploads
from services.upload.merge.file_locks import FileLocks
from services.upload.merge.inline import InlineMerges
from services.upload.merge.merge_job import MERGE_JOB, MergeHandler, enqueue_merge
from services.upload.merge.restore_version import VersionRestores
from services.upload.merge.stuck_merges import fail_dead_merges
from services.upload.merge.upload_file import FileLockPolicy, UploadFiles
from services.upload.rate_families import rate_policy
from services.upload.settings import UploadSettings
from services.upload.storage.blob_store import BlobStore, open_blob_store, traced
from services.upload.storage.lifecycle import (
    PURGE_CHUNKS_JOB,
    RECLAIM_JOB,
    ReclaimPolicy,
    purge_chunks_handler,
    reclaim_handler,
    reclaim_schedule,
)
from services.upload.sync.settings import SyncSettings
from services.upload.sync.wiring import SyncWiring, wire_sync
from services.upload.tus import Tails, TusServer, TusUploads

# How long each of the outbox relay's write transactions waits for a small write to share
# a COMMIT with (SQLite): about two small files' time one at a time. When nothing else
# commits, an event is published that much later, twice (its round's lease and mark).
RELAY_WAITS_FOR_COMPANY_SECONDS = 0.025
# Woken by a commit, the relay waits this long for the next ones before its round: one
# file at a time would otherwise pay a whole round (two transactions, a call to notify,
# notify's own writes) every few files; notifications go out this much later, well within
# the second a collaborator hears of a new version in (DESIGN.md). 25 ms cost a file alone
# on PostgreSQL ~0.9 ms of its p50 and ~1 ms of CPU (upload and notify) over 100 ms.
RELAY_GATHERS_SECONDS = 0.1


@dataclass
class UploadComponents:
    """Everything the upload service runs on."""

    settings: UploadSettings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    auth: Authenticator
    blobs: BlobStore
    locks: FileLocks
    uploads: Uploads
    # GetUpload's wait_finished_ms: the in-process notifier and the waiting use case.
    signals: FinishSignals
    waits: UploadWaits
    chunks: ChunkStore
    # Merges run in the request that starts them (UploadFile, small uploads' last chunk).
    inline: InlineMerges
    upload_files: UploadFiles
    # The small writes' group committer (UploadFile commits, download audit rows).
    small_writes: GroupCommits
    # RestoreVersion: an older version committed again under the file lock.
    restores: VersionRestores
    files: Files
    # ListChanges and the wake-ups of its long polls.
    changes: ChangeFeed
    change_signals: ChangeSignals
    # Rate limits per RPC family, user and tenant, applied by the RPC wrapper; counted in
    # the upload database when it is PostgreSQL (every replica's), else in memory.
    rates: RateGate
    registry: JobRegistry
    runtime: JobRuntime
    sync: SyncWiring
    subscribers: list[GrpcIngestSubscriber]
    # The tus 1.0 endpoint (tus_enabled), served by the app as a background task.
    tus: TusServer | None = None

    async def close(self) -> None:
        """Release connections (provider, notify and lock service channels, database pool)."""
        # First: the chunk reader's kept connection must be back before anything below
        # can fail (a pooled connection never returned is terminated by the collector).
        await self.uploads.close()
        # Before the lock client closes: a run still going hands its job back.
        await self.upload_files.close()
        await self.small_writes.close()
        await self.restores.close()
        await self.inline.close()
        await self.signals.close()
        self.change_signals.close()
        await self.sync.close()
        for subscriber in self.subscribers:
            await subscriber.close()
        await self.locks.close()
        await self.chunks.close()
        await self.blobs.close()
        await self.rates.limiter.close()
        await dispose_when_returned(self.engine)


def reclaim_policy(settings: UploadSettings) -> ReclaimPolicy:
    """The storage lifecycle's grace periods and version retention from settings."""
    return ReclaimPolicy(
        failed_grace_seconds=settings.failed_upload_grace_seconds,
        version_keep_count=settings.version_keep_count,
        version_keep_days=settings.version_keep_days,
        orphan_grace_seconds=settings.orphan_grace_seconds,
        temp_grace_seconds=settings.temp_grace_seconds,
    )


def build_components(
    settings: UploadSettings,
    runtime_options: RuntimeOptions | None = None,
    sync_settings: SyncSettings | None = None,
) -> UploadComponents:
    """Build and wire the parts (the database must already be migrated).

    `sync_settings` defaults to `SyncSettings` read from the environment (`SERENTAK_SYNC_*`).
    """
    engine = create_engine(settings.database_url, sqlite_synchronous=settings.sqlite_synchronous)
    sessions = session_factory(engine)
    options = runtime_options or RuntimeOptions(
        lease_seconds=settings.worker_lease_seconds,
        poll_interval=settings.worker_poll_seconds,
        stats_interval=settings.metrics_sample_seconds,
        relay_gather_seconds=RELAY_GATHERS_SECONDS,
    )
    # Spans around its reads, writes and merges when tracing is on.
    blobs = traced(open_blob_store(settings, sessions))
    auth = build_authenticator(settings)
    # Calls to locks and notify go out as the `upload` principal, each verifying the name
    # its callee's certificates carry.
    to_locks = service_client_security(settings, UPLOAD, "locks")
    to_notify = service_client_security(settings, UPLOAD, "notify")
    locks = FileLocks(
        settings.locks_address, owner=f"upload-merge:{options.node_id}", security=to_locks
    )
    tokens = PageTokens(settings.page_token_secret.get_secret_value())
    signals = FinishSignals(
        sessions,
        max_waiters=settings.upload_wait_max_waiters,
        recheck_seconds=settings.upload_wait_recheck_ms / 1000,
    )
    uploads = Uploads(sessions, settings, tokens, on_finished=signals.finished)
    chunks = ChunkStore(
        sessions, uploads, blobs, enqueue_merge, upload_ttl_seconds=settings.upload_ttl_seconds
    )
    registry = JobRegistry()
    # The handler knows the policy too: its last attempt records the failure on the upload.
    merge_retry = RetryPolicy(
        max_attempts=settings.merge_max_attempts,
        base_seconds=settings.merge_retry_base_seconds,
        cap_seconds=settings.merge_retry_cap_seconds,
    )
    registry.register(
        MERGE_JOB,
        MergeHandler(
            blobs,
            locks,
            lock_ttl_seconds=settings.merge_lock_ttl_seconds,
            lock_wait_seconds=settings.merge_lock_wait_ms / 1000,
            retry=merge_retry,
            signals=signals,
        ),
        retry=merge_retry,
    )
    registry.register(
        EXPIRE_JOB,
        expiry_handler(
            blobs,
            settings.upload_ttl_seconds,
            functools.partial(fail_dead_merges, signals=signals),
            on_expired=signals.wake_all,
        ),
        retry=RetryPolicy(max_attempts=3, base_seconds=1, cap_seconds=30),
    )
    registry.register(
        PURGE_CHUNKS_JOB,
        purge_chunks_handler(blobs),
        retry=RetryPolicy(max_attempts=10, base_seconds=1, cap_seconds=300),
    )
    registry.register(
        PURGE_TRASH_JOB,
        purge_trash_handler(timedelta(days=settings.trash_retention_days)),
        retry=RetryPolicy(max_attempts=3, base_seconds=1, cap_seconds=30),
    )
    registry.register(
        PURGE_CHANGES_JOB,
        purge_changes_handler(timedelta(days=settings.change_log_retention_days)),
        retry=RetryPolicy(max_attempts=3, base_seconds=1, cap_seconds=30),
    )
    registry.register(
        RECLAIM_JOB,
        reclaim_handler(blobs, reclaim_policy(settings)),
        retry=RetryPolicy(max_attempts=3, base_seconds=1, cap_seconds=30),
    )
    sync_config = sync_settings or load(SyncSettings)
    sync = wire_sync(
        sync_config,
        sessions,
        registry,
        auth,
        settings.data_dir / "sync-cache",
        retire_files=retire_files,
        auth_mode=require_mode(settings),
    )
    schedules = [
        expiry_schedule(settings.expiry_interval_seconds),
        reclaim_schedule(settings.reclaim_interval_seconds),
        purge_trash_schedule(settings.trash_purge_interval_seconds),
        purge_changes_schedule(settings.change_log_purge_interval_seconds),
        register_runtime_retention(registry, settings),
    ]
    if sync_config.enabled:
        schedules.extend(sync.schedules)
    # Events reach collaborators through notify's Ingest (idempotent by event_id).
    subscribers = (
        [GrpcIngestSubscriber(settings.notify_address, to_notify)]
        if settings.publish_events
        else []
    )
    # One group committer for the process's small writes (UploadFile commits, download
    # audit rows; on SQLite the outbox relay's bookkeeping too, `outbox.relay`): concurrent
    # ones share a transaction. The relay's units wait a little for the next small write
    # to commit with, so a file at a time does not pay two more WAL fsyncs for its event.
    small_writes = GroupCommits(sessions, on_group=metrics.COMMIT_GROUP_UNITS.observe)
    runtime = JobRuntime(
        sessions,
        registry,
        options,
        subscribers=subscribers,
        schedules=schedules,
        relay_writes=(
            functools.partial(small_writes.run, wait_for_company=RELAY_WAITS_FOR_COMPANY_SECONDS)
            if is_sqlite(settings.database_url)
            else None
        ),
    )
    inline = InlineMerges(
        sessions, registry, node_id=options.node_id, lease_seconds=options.lease_seconds
    )
    lock_policy = FileLockPolicy(
        ttl_seconds=settings.merge_lock_ttl_seconds,
        wait_seconds=settings.merge_lock_wait_ms / 1000,
    )
    change_signals = ChangeSignals(
        settings.change_wait_recheck_ms / 1000, max_waiters=settings.change_wait_max_waiters
    )
    rates = RateGate(
        rate_policy(settings),
        Limiter(
            database_store(settings.database_url),
            service="upload",
            window_seconds=settings.rate_limit_window_seconds,
            batch_max=settings.rate_limit_batch_max,
        ),
        auth,
    )
    tus = None
    if settings.tus_enabled:
        tails = Tails(settings.tus_root, fsync=settings.blob_fsync)
        store = TusUploads(sessions, settings, uploads, chunks, blobs, tails, inline, runtime.wake)
        tus = TusServer(store, auth, rates, settings)
    return UploadComponents(
        settings=settings,
        engine=engine,
        sessions=sessions,
        auth=auth,
        blobs=blobs,
        locks=locks,
        uploads=uploads,
        signals=signals,
        waits=UploadWaits(uploads, signals, max_wait_ms=settings.upload_wait_max_ms),
        chunks=chunks,
        inline=inline,
        upload_files=UploadFiles(
            sessions,
            uploads,
            chunks,
            inline,
            blobs=blobs,
            locks=locks,
            signals=signals,
            max_chunk_size=settings.max_chunk_size,
            groups=small_writes,
            lock_policy=lock_policy,
            write_during_commit=settings.blob_backend == "local",
        ),
        restores=VersionRestores(sessions, blobs, locks, uploads, lock_policy),
        files=Files(
            sessions,
            blobs,
            ListingCache(settings.listing_cache_entries),
            tokens,
            share_batch_max=settings.share_batch_max,
            groups=small_writes,
        ),
        changes=ChangeFeed(
            sessions, tokens, change_signals, max_wait_ms=settings.change_wait_max_ms
        ),
        change_signals=change_signals,
        small_writes=small_writes,
        rates=rates,
        registry=registry,
        runtime=runtime,
        sync=sync,
        subscribers=subscribers,
        tus=tus,
    )
