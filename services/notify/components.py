"""The notify service's parts, built once from settings and wired together.

`app.py` turns these into a `ServiceApp`; tests build them directly to reach the job
runtime and the broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from services.common.auth import Authenticator, build_authenticator
from services.common.db import create_engine, is_sqlite, session_factory
from services.common.jobs import JobRegistry, RetryPolicy
from services.common.jobs.listener import CommitListener
from services.common.jobs.runtime import JobRuntime, RuntimeOptions
from services.common.retention import register_runtime_retention
from services.notify.fanout_job import FANOUT_JOB, FANOUT_RETRY, FanOutHandler
from services.notify.fanout_writer import FanOutWriter
from services.notify.inbox import Inbox
from services.notify.parked import ParkedSampler
from services.notify.remote_deliveries import RemoteDeliveries
from services.notify.retention import RETENTION_JOB, RetentionJob, retention_schedule
from services.notify.settings import NotifySettings
from services.notify.stream_listener import stream_listener
from services.notify.streams import Broker, StreamReader


@dataclass
class NotifyComponents:
    """Everything the notify service runs on."""

    settings: NotifySettings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    auth: Authenticator
    broker: Broker
    inbox: Inbox
    streams: StreamReader
    registry: JobRegistry
    runtime: JobRuntime
    parked: ParkedSampler
    # PostgreSQL: wakes this replica's streams on every replica's commits; None on SQLite.
    stream_listener: CommitListener | None
    # PostgreSQL: reads other replicas' commits for the woken streams; None on SQLite.
    remote_deliveries: RemoteDeliveries | None


def build_components(
    settings: NotifySettings, runtime_options: RuntimeOptions | None = None
) -> NotifyComponents:
    """Build and wire the parts (the database must already be migrated)."""
    # No ping per checkout (a round trip on every Ingest and stream read): notify runs
    # its transactions through `sql.retrying`, which reruns one on a lost connection,
    # and the job runtime retries a failed job.
    engine = create_engine(
        settings.database_url, sqlite_synchronous=settings.sqlite_synchronous, pre_ping=False
    )
    sessions = session_factory(engine)
    broker = Broker(settings.stream_buffer_size)
    registry = JobRegistry()
    writer = FanOutWriter(broker, digest_window=timedelta(seconds=settings.digest_window_seconds))
    registry.register(
        FANOUT_JOB,
        FanOutHandler(writer, max_batch=settings.fanout_batch_max),
        retry=FANOUT_RETRY,
    )
    registry.register(
        RETENTION_JOB,
        RetentionJob(
            read_older_than=timedelta(seconds=settings.read_retention_seconds),
            inbox_older_than=timedelta(seconds=settings.inbox_retention_seconds),
            unread_older_than=(
                timedelta(seconds=settings.unread_retention_seconds)
                if settings.unread_retention_seconds
                else None
            ),
            retired_older_than=timedelta(seconds=settings.retired_aggregate_retention_seconds),
        ),
        retry=RetryPolicy(max_attempts=3, base_seconds=5.0, cap_seconds=60.0),
    )
    options = runtime_options or RuntimeOptions(
        concurrency=settings.worker_concurrency,
        lease_seconds=settings.worker_lease_seconds,
        poll_interval=settings.worker_poll_seconds,
    )
    runtime = JobRuntime(
        sessions,
        registry,
        options,
        schedules=[
            retention_schedule(settings.retention_interval_seconds),
            register_runtime_retention(registry, settings),
        ],
    )
    inbox = Inbox(
        sessions,
        max_audience=settings.max_audience,
        on_accepted=runtime.wake,
        writer=writer,
        inline_max=settings.inline_fanout_max,
    )
    sqlite = is_sqlite(settings.database_url)
    remote = None if sqlite else RemoteDeliveries(sessions, broker)
    if remote is not None:
        broker.attach_remote(remote)
    return NotifyComponents(
        settings=settings,
        engine=engine,
        sessions=sessions,
        auth=build_authenticator(settings),
        broker=broker,
        inbox=inbox,
        streams=StreamReader(sessions, broker),
        registry=registry,
        runtime=runtime,
        parked=ParkedSampler(sessions, settings.parked_sample_seconds),
        stream_listener=None if sqlite else stream_listener(engine.url, broker),
        remote_deliveries=remote,
    )
