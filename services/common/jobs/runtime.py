"""One object a service builds in its app.py to run all its background work.

    registry = JobRegistry()
    registry.register("merge_upload", merge_upload, retry=RetryPolicy(max_attempts=5))
    runtime = JobRuntime(sessions, registry, RuntimeOptions(node_id="upload-1"),
                         subscribers=[GrpcIngestSubscriber(addr, token)],
                         schedules=[PeriodicSchedule("expire_uploads", 60)])
    ServiceApp(..., background=runtime.background())

`background()` returns the coroutine functions `ServiceApp` runs and cancels at
shutdown: the workers, the outbox relay (when there are subscribers), the periodic
scheduler (when there are schedules), the commit listener (PostgreSQL: wakes idle
workers and the relay when another process commits a job or an event) and the metrics
sampler.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from services.common.jobs import metrics
from services.common.jobs.listener import JOBS_CHANNEL, OUTBOX_CHANNEL, CommitListener
from services.common.jobs.periodic import PeriodicSchedule, PeriodicScheduler
from services.common.jobs.registry import JobRegistry
from services.common.jobs.stats import queue_stats
from services.common.jobs.worker import Worker
from services.common.logging import get_logger
from services.common.outbox.dead_letters import OUTBOX_PUBLISH_JOB, republish
from services.common.outbox.relay import Relay, Writes
from services.common.outbox.subscribers import Subscriber

log = get_logger(__name__)


def default_node_id() -> str:
    """hostname:pid — unique per process, readable in dead letters and logs."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """Tuning of the runtime; the defaults suit a small deployment."""

    node_id: str = field(default_factory=default_node_id)
    workers: int = 1
    concurrency: int = 4
    lease_seconds: float = 30.0
    poll_interval: float = 0.5
    relay_lease_seconds: float = 30.0
    relay_poll_interval: float = 0.5
    # Woken by a commit, the relay waits this long for more before its round.
    relay_gather_seconds: float = 0.0
    stats_interval: float = 15.0
    # PostgreSQL: LISTEN for other processes' enqueues and outbox events (see listener.py).
    listen: bool = True


class JobRuntime:
    """Workers, relay, periodic scheduler and metrics sampler for one service."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: JobRegistry,
        options: RuntimeOptions | None = None,
        *,
        subscribers: Sequence[Subscriber] = (),
        schedules: Sequence[PeriodicSchedule] = (),
        relay_writes: Writes | None = None,
    ) -> None:
        """`relay_writes`: how the outbox relay runs its write transactions (a group
        committer's units, where the service has one; `outbox.relay`)."""
        self.sessions = sessions
        self.registry = registry
        # Replaying an outbox dead letter runs this job (any service with an outbox).
        if registry.get(OUTBOX_PUBLISH_JOB) is None:
            registry.register(OUTBOX_PUBLISH_JOB, republish)
        self.options = options or RuntimeOptions()
        o = self.options
        self.workers = [
            Worker(
                sessions,
                registry,
                worker_id=f"{o.node_id}/w{i}",
                lease_seconds=o.lease_seconds,
                poll_interval=o.poll_interval,
                concurrency=o.concurrency,
            )
            for i in range(o.workers)
        ]
        self.relay = (
            Relay(
                sessions,
                subscribers,
                relay_id=f"{o.node_id}/relay",
                lease_seconds=o.relay_lease_seconds,
                poll_interval=o.relay_poll_interval,
                writes=relay_writes,
                gather_seconds=o.relay_gather_seconds,
            )
            if subscribers
            else None
        )
        unknown = [s.job_type for s in schedules if registry.get(s.job_type) is None]
        if unknown:
            raise ValueError(f"periodic schedules for unregistered job types: {unknown}")
        self.scheduler = (
            PeriodicScheduler(sessions, schedules, scheduler_id=f"{o.node_id}/periodic")
            if schedules
            else None
        )
        self.listener = self._commit_listener() if o.listen else None

    def _commit_listener(self) -> CommitListener | None:
        engine = self.sessions.kw.get("bind")
        if not isinstance(engine, AsyncEngine) or engine.dialect.name != "postgresql":
            return None
        wakeups: dict[str, Callable[[], None]] = {}
        if self.registry.names:
            wakeups[JOBS_CHANNEL] = self.wake_workers
        if self.relay is not None:
            wakeups[OUTBOX_CHANNEL] = self.relay.wake
        return CommitListener(engine.url, wakeups) if wakeups else None

    def wake_workers(self) -> None:
        """Tell in-process workers that a job may be claimable now."""
        for worker in self.workers:
            worker.wake()

    def wake(self) -> None:
        """Tell in-process workers and the relay that something was just committed."""
        self.wake_workers()
        if self.relay is not None:
            self.relay.wake()

    def background(self) -> list[Callable[[], Awaitable[None]]]:
        """Coroutine functions for `ServiceApp.background`."""
        tasks: list[Callable[[], Awaitable[None]]] = []
        if self.registry.names:
            tasks.extend(worker.run for worker in self.workers)
        if self.relay is not None:
            tasks.append(self.relay.run)
        if self.scheduler is not None:
            tasks.append(self.scheduler.run)
        if self.listener is not None:
            tasks.append(self.listener.run)
        tasks.append(self.sample_metrics)
        return tasks

    async def sample_metrics(self) -> None:
        """Refresh the queue gauges every `stats_interval` seconds."""
        while True:
            try:
                async with self.sessions() as session, session.begin():
                    stats = await queue_stats(session)
                for t in stats.job_types:
                    metrics.QUEUE_DEPTH.labels(t.job_type).set(t.queued + t.running)
                    metrics.QUEUE_LAG.labels(t.job_type).set(t.lag_seconds)
                    metrics.DLQ_SIZE.labels(t.job_type).set(t.dead_letters)
                metrics.OUTBOX_UNPUBLISHED.set(stats.unpublished_events)
                metrics.OUTBOX_OLDEST_AGE.set(stats.oldest_unpublished_event_age_seconds)
            except Exception:
                log.exception("queue_stats_failed")
            await asyncio.sleep(self.options.stats_interval)
