"""The worker: claim jobs, run their handlers with a heartbeat, then complete, retry or bury.

One `Worker` is an asyncio loop with bounded concurrency. Run several per process and
several processes per service; the claim (see `sql.py`) keeps per-partition order and
hands each job to one lease holder at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from services.common import tracing
from services.common.correlation import bound_correlation_id
from services.common.jobs import metrics
from services.common.jobs.completions import CompletionBatcher
from services.common.jobs.dead_letters import dead_letter
from services.common.jobs.errors import (
    PERMANENT,
    LeaseLost,
    error_class_of,
    retry_after_of,
)
from services.common.jobs.idempotency import AlreadyApplied
from services.common.jobs.job import ClaimedJob, JobContext
from services.common.jobs.models import utcnow
from services.common.jobs.queue import (
    claim_jobs,
    complete,
    complete_applied,
    heartbeat,
    promote_stranded,
    release,
    reschedule,
)
from services.common.jobs.registry import JobRegistry, JobType
from services.common.logging import get_logger

log = get_logger(__name__)

DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_POLL_SECONDS = 0.5
DEFAULT_CONCURRENCY = 4
STRANDED_SWEEP_SECONDS = 5.0


class WorkerLost(Exception):
    """The job's earlier attempts ended with their worker gone (lease expired mid-job)."""


class Worker:
    """Claims and runs jobs of the registry's types until cancelled.

    Leases last `lease_seconds` and are renewed every `heartbeat_interval` while the
    handler runs; a worker that dies (SIGKILL) stops renewing and its job becomes
    claimable again once the lease ends. When idle, the worker polls every
    `poll_interval` seconds (or sooner when `wake()` is called).
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: JobRegistry,
        *,
        worker_id: str,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        heartbeat_interval: float | None = None,
        poll_interval: float = DEFAULT_POLL_SECONDS,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.sessions = sessions
        self.registry = registry
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        # A third of the lease: two heartbeats may fail before the lease is at risk.
        self.heartbeat_interval = heartbeat_interval or lease_seconds / 3
        self.poll_interval = poll_interval
        self.concurrency = concurrency
        self._wake = asyncio.Event()
        # Claim statements issued so far, and "waiting for a wake-up or the next poll"
        # (observable state for tests and tools).
        self.claim_rounds = 0
        self.idling = asyncio.Event()
        self._claim_connection: AsyncConnection | None = None
        self._completions = CompletionBatcher(sessions)
        self._handling: set[int] = set()  # ids of claimed jobs whose handler runs
        self._swept_at = float("-inf")  # last stranded-head sweep (monotonic seconds)
        self._slot_freed = asyncio.Event()

    def wake(self) -> None:
        """Claim again now instead of at the next poll (e.g. after an in-process enqueue)."""
        self._wake.set()

    async def run(self) -> None:
        """Claim and run jobs until cancelled; in-flight jobs are handed back on cancel.

        One claim leases as many jobs as there are free slots (distinct partitions, see
        `sql.py`), so a busy worker pays one claim round trip for several jobs.
        """
        running: set[asyncio.Task[None]] = set()
        # While the queue has more than we can take, claim only once half the slots are
        # free: a round trip per batch rather than per finished job. Once a claim comes
        # back short (the queue is drained), claim for any free slot, for latency.
        batch = max(1, self.concurrency // 2)
        backlog = False
        self._completions.keep_connection()
        log.info("worker_started", worker_id=self.worker_id, job_types=self.registry.names)
        try:
            while True:
                if self._claim_connection is None:
                    await self._open_claim_connection()
                # A slot is a running handler. A job whose handler is done but whose
                # acknowledgement waits for its batch holds none, so the next claim
                # overlaps the batch; at most `concurrency` more such jobs.
                free = min(
                    self.concurrency - len(self._handling), 2 * self.concurrency - len(running)
                )
                if free <= 0 or (backlog and free < batch):
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                    continue
                # Cleared before the claim: a wake-up arriving while it runs (an enqueue,
                # a finished job unblocking its partition) makes the next idle a no-op.
                self._wake.clear()
                claimed = await self._claim(free)
                backlog = len(claimed) == free
                if not claimed:
                    await self._idle()
                    continue
                for job in claimed:
                    self._handling.add(job.id)
                    task = asyncio.create_task(self.execute(job))
                    running.add(task)
                    task.add_done_callback(self._job_done(running, job.id))
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await self._completions.close()
            await asyncio.shield(self._close_claim_connection())
            log.info("worker_stopped", worker_id=self.worker_id)

    def _job_done(
        self, running: set[asyncio.Task[None]], job_id: int
    ) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            self._handler_finished(job_id)
            # The next job of its partition may be claimable now: look without waiting
            # for the poll.
            self._wake.set()

        return done

    def _handler_finished(self, job_id: int) -> None:
        """The job's handler slot is free (its acknowledgement may still be pending)."""
        self._handling.discard(job_id)
        self._slot_freed.set()

    async def run_once(self) -> bool:
        """Claim and run at most one job; True if one ran (tests and tools use this)."""
        claimed = await self._claim(1)
        if not claimed:
            return False
        await self.execute(claimed[0])
        return True

    async def _idle(self) -> None:
        self.idling.set()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()
        finally:
            self.idling.clear()

    async def _claim(self, limit: int) -> list[ClaimedJob]:
        self.claim_rounds += 1
        sweep = self._sweep_due()
        try:
            if self._claim_connection is None:
                async with self.sessions() as session, session.begin():
                    return await self._claim_in(session, limit, sweep)
            async with self._claim_connection.begin():
                return await self._claim_in(self._claim_connection, limit, sweep)
        except Exception:
            # The database is unreachable or busy: not a reason to stop the worker.
            log.exception("job_claim_failed", worker_id=self.worker_id)
            await self._close_claim_connection()
            return []

    def _sweep_due(self) -> bool:
        """Whether this claim first promotes stranded heads (`sql.PROMOTE_STRANDED`, a
        pass over the jobs' partition index): every STRANDED_SWEEP_SECONDS, the longest
        such a job waits; stranding takes an enqueue that outlives the run of the job
        right ahead of it (runtime_0003)."""
        now = time.monotonic()
        if now - self._swept_at < max(self.poll_interval, STRANDED_SWEEP_SECONDS):
            return False
        self._swept_at = now
        return True

    async def _claim_in(
        self, executor: AsyncSession | AsyncConnection, limit: int, sweep: bool
    ) -> list[ClaimedJob]:
        """The claim (after the stranded-head sweep when due) in the caller's transaction."""
        if sweep:
            promoted = await promote_stranded(executor)
            if promoted:
                log.info("job_heads_promoted", worker_id=self.worker_id, jobs=promoted)
        return await claim_jobs(
            executor, self.worker_id, self.registry.names, self.lease_seconds, limit
        )

    async def _open_claim_connection(self) -> None:
        # The claim loop keeps one connection: no pool checkout, pre-ping or ORM session
        # per claim. Without an engine behind `sessions`, claims use sessions instead.
        engine = self.sessions.kw.get("bind")
        if isinstance(engine, AsyncEngine):
            with contextlib.suppress(Exception):
                connection = await engine.connect()
                if connection.dialect.name == "postgresql":
                    # The claim is one statement, atomic on its own: autocommit spares
                    # the BEGIN and COMMIT round trips. (SQLite's claim needs its
                    # BEGIN IMMEDIATE: the write lock is taken before the read.)
                    await connection.execution_options(isolation_level="AUTOCOMMIT")
                self._claim_connection = connection

    async def _close_claim_connection(self) -> None:
        connection, self._claim_connection = self._claim_connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def execute(self, job: ClaimedJob) -> None:
        """Run one claimed job to its outcome: completed, retried, dead-lettered or lost."""
        job_type = self.registry.get(job.job_type)
        assert job_type is not None, "claims only return registered job types"
        with (
            bound_correlation_id(job.correlation_id),
            structlog.contextvars.bound_contextvars(
                job_id=job.job_id,
                job_type=job.job_type,
                idempotency_key=job.idempotency_key,
                attempt=job.attempts,
                worker_id=self.worker_id,
            ),
            # The trace of the request that enqueued it goes on here (tracing.py).
            tracing.continued(
                job.traceparent,
                f"job {job.job_type}",
                job_id=job.job_id,
                job_type=job.job_type,
                attempt=job.attempts,
                worker_id=self.worker_id,
                correlation_id=job.correlation_id,
            ) as span,
        ):
            lag = (utcnow() - max(job.run_after, job.enqueued_at)).total_seconds()
            metrics.JOB_START_LAG.labels(job.job_type).observe(max(lag, 0.0))
            log.info("job_started", lag_seconds=round(lag, 4))
            beat = _LazyHeartbeat(self, job)
            started = time.monotonic()
            outcome = "failed"
            try:
                outcome = await self._attempt(job_type, job)
            except asyncio.CancelledError:
                # Hand the job back, bounded: on SQLite the cancelled attempt's own
                # transaction may still hold the write lock for a while, and a stop must
                # not wait behind it. A release that does not happen leaves the job to
                # its lease, which expires and lets another worker claim it.
                try:
                    async with asyncio.timeout(_RELEASE_ON_CANCEL_S):
                        await self._release(job)
                except TimeoutError:
                    log.warning("job_release_abandoned", timeout_s=_RELEASE_ON_CANCEL_S)
                raise
            except LeaseLost:
                outcome = "lease_lost"
                metrics.LEASES_LOST.labels(job.job_type).inc()
                log.warning("job_lease_lost")
            except Exception as exc:
                outcome = await self._fail(job_type, job, exc)
            finally:
                beat.stop()
                elapsed = time.monotonic() - started
                metrics.JOB_DURATION.labels(job.job_type, outcome).observe(elapsed)
            log.info("job_finished", outcome=outcome, duration_seconds=round(elapsed, 4))
            tracing.annotate(span, outcome=outcome)

    async def _attempt(self, job_type: JobType, job: ClaimedJob) -> str:
        if job.attempts > job_type.retry.max_attempts:
            # Every earlier attempt lost its worker mid-job (crash loop): stop here.
            raise WorkerLost(f"lease expired {job.attempts - 1} times without an outcome")
        try:
            if job.already_applied:
                # Seen by the claim: no handler run, no second effect.
                async with self.sessions() as session, session.begin():
                    await complete(session, job)
                metrics.JOBS_ALREADY_APPLIED.labels(job.job_type).inc()
                return "already_applied"
            # The handler's transaction begins at its first statement (see JobContext);
            # the unique key still catches a key applied since the claim. Closing the
            # session without a commit rolls back whatever the handler did.
            async with self.sessions() as session:
                ctx = JobContext(
                    job=job, session=session, worker_id=self.worker_id, sessions=self.sessions
                )
                await job_type.handler(ctx)
                if _wrote(session):
                    with tracing.span("job commit"):
                        await complete_applied(session, job, ctx.effect)
                        await session.commit()
                    return "completed"
            # Nothing of the handler's to commit with it: acknowledged with other jobs
            # in one statement (see completions.py), while the next claim goes ahead.
            self._handler_finished(job.id)
            if await self._completions.complete(job, ctx.effect):
                return "completed"
            metrics.JOBS_ALREADY_APPLIED.labels(job.job_type).inc()
            return "already_applied"
        except AlreadyApplied:
            # A concurrent job with the same key won; ours rolled back. Acknowledge it.
            async with self.sessions() as session, session.begin():
                await complete(session, job)
            metrics.JOBS_ALREADY_APPLIED.labels(job.job_type).inc()
            return "already_applied"

    async def _fail(self, job_type: JobType, job: ClaimedJob, exc: Exception) -> str:
        error_class = error_class_of(exc)
        exc_info = exc if error_class in ("bug",) else None
        try:
            if error_class == PERMANENT or job_type.retry.gives_up_after(job.attempts):
                async with self.sessions() as session, session.begin():
                    moved = await dead_letter(session, job, exc, self.worker_id)
                if not moved:
                    raise LeaseLost(job.job_id)
                metrics.JOB_DEAD_LETTERED.labels(job.job_type, error_class).inc()
                log.error(
                    "job_dead_lettered",
                    error_class=error_class,
                    error=f"{type(exc).__name__}: {exc}",
                    exc_info=exc,
                )
                return "dead_lettered"
            delay = job_type.retry.delay(job.attempts, retry_after_of(exc))
            async with self.sessions() as session, session.begin():
                kept = await reschedule(
                    session,
                    job,
                    utcnow() + timedelta(seconds=delay),
                    error_class,
                    f"{type(exc).__name__}: {exc}",
                )
            if not kept:
                raise LeaseLost(job.job_id)
            metrics.JOB_RETRIES.labels(job.job_type, error_class).inc()
            log.warning(
                "job_retry_scheduled",
                error_class=error_class,
                error=f"{type(exc).__name__}: {exc}",
                delay_seconds=round(delay, 3),
                exc_info=exc_info,
            )
            return "retried"
        except LeaseLost:
            metrics.LEASES_LOST.labels(job.job_type).inc()
            log.warning("job_lease_lost")
            return "lease_lost"
        except Exception:
            # Bookkeeping failed (database down): the lease will end and the job run again.
            log.exception("job_failure_not_recorded")
            return "unrecorded"

    async def _heartbeat(self, job: ClaimedJob) -> None:
        """Renew the lease now and then every `heartbeat_interval` (see _LazyHeartbeat)."""
        while True:
            try:
                async with self.sessions() as session, session.begin():
                    alive = await heartbeat(session, job, self.lease_seconds)
            except Exception:
                log.exception("job_heartbeat_failed")
            else:
                if not alive:
                    # The completion is conditional on the lease, so nothing is applied
                    # twice; the handler is left to finish and will be rolled back.
                    log.warning("job_heartbeat_lease_lost")
                    return
            await asyncio.sleep(self.heartbeat_interval)

    async def _release(self, job: ClaimedJob) -> None:
        try:
            async with self.sessions() as session, session.begin():
                await release(session, job)
            log.info("job_released")
        except Exception:
            log.exception("job_release_failed")


def _wrote(session: AsyncSession) -> bool:
    """Whether the handler used its session (began its transaction or staged objects)."""
    return bool(session.in_transaction() or session.new or session.dirty or session.deleted)


# How long a cancelled job may take to hand itself back before its lease is left to expire.
_RELEASE_ON_CANCEL_S = 2.0


class _LazyHeartbeat:
    """Renews a job's lease, starting only after one `heartbeat_interval` has passed.

    A timer instead of a task per job: most jobs finish well within the first interval
    and then cost nothing here.
    """

    def __init__(self, worker: Worker, job: ClaimedJob) -> None:
        self._worker = worker
        self._job = job
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(worker.heartbeat_interval, self._start)

    def _start(self) -> None:
        self._task = asyncio.create_task(self._worker._heartbeat(self._job))

    def stop(self) -> None:
        """Cancel the timer or the running heartbeat."""
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
