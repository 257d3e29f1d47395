"""The job runtime: a per-key ordered queue with leases, retries, idempotency and a DLQ.

Import what a service needs from here; the modules are one noun each (queue, worker,
retry, errors, idempotency, dead_letters, periodic, runtime, sql, models, metrics).
"""

from services.common.jobs.errors import (
    ConflictError,
    JobError,
    PermanentError,
    RetryLater,
    TransientError,
)
from services.common.jobs.job import ClaimedJob, Handler, JobContext, NewJob
from services.common.jobs.periodic import PeriodicSchedule, PeriodicScheduler
from services.common.jobs.queue import enqueue
from services.common.jobs.registry import JobRegistry, JobType
from services.common.jobs.retry import RetryPolicy
from services.common.jobs.worker import Worker


def __getattr__(name: str) -> object:
    # The runtime imports the outbox, which imports job modules: loading it lazily keeps
    # `import services.common.outbox` from meeting a half-initialised `jobs` package.
    if name in ("JobRuntime", "RuntimeOptions"):
        from services.common.jobs import runtime

        return getattr(runtime, name)
    raise AttributeError(name)


__all__ = [
    "ClaimedJob",
    "ConflictError",
    "Handler",
    "JobContext",
    "JobError",
    "JobRegistry",
    "JobRuntime",
    "JobType",
    "NewJob",
    "PeriodicSchedule",
    "PeriodicScheduler",
    "PermanentError",
    "RetryLater",
    "RetryPolicy",
    "RuntimeOptions",
    "TransientError",
    "Worker",
    "enqueue",
]
