"""The values a job is made of: what is enqueued, what a worker claims, what a handler sees."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to enqueue.

    The payload is small JSON (ids and a version, never file contents): handlers re-read
    current state. Jobs with the same `partition_key` run one at a time in enqueue order.
    `idempotency_key` names the effect: once a job with that key has been applied, any
    other job with the same key is acknowledged without running. Jobs of one type sharing
    a `dedupe_key` inside `dedupe_window_seconds` collapse into one that runs once, with the
    latest payload, when the window closes.
    """

    job_type: str
    payload: dict[str, Any]
    partition_key: str
    idempotency_key: str
    dedupe_key: str | None = None
    dedupe_window_seconds: float = 0.0
    correlation_id: str | None = None
    # None: as soon as possible.
    run_after: datetime | None = None


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job leased to one worker; `lease_token` proves the lease is still ours."""

    id: int
    job_id: str
    job_type: str
    partition_key: str
    idempotency_key: str
    payload: dict[str, Any]
    correlation_id: str
    attempts: int
    enqueued_at: datetime
    run_after: datetime
    first_attempt_at: datetime | None
    lease_token: str
    claimed_by: str
    # Its idempotency key was applied when it was claimed: acknowledge without running.
    already_applied: bool = False
    # The W3C traceparent it was enqueued under (None: untraced); its run continues it.
    traceparent: str | None = None


@dataclass(slots=True)
class JobContext:
    """What a handler gets: the job and a session inside the job's own transaction.

    The runtime records the idempotency key and completes the job in the same
    transaction, so the handler's DB writes, the idempotency record and the completion
    commit together or not at all. Do not commit or roll back `session` yourself.
    Handlers that call other services must make those calls idempotent on their own
    (pass `idempotency_key` along): a crash after the call but before commit repeats it.

    The job's transaction begins at the handler's first statement on `session`. Slow work
    (a merge, a network call) belongs before that point: on SQLite a begun transaction
    holds the database's write lock. `sessions` opens short transactions of its own for
    reads that such work needs first.
    """

    job: ClaimedJob
    session: AsyncSession
    worker_id: str
    sessions: async_sessionmaker[AsyncSession] | None = None
    # Optional small JSON summary of what the handler did, stored with the idempotency key.
    effect: dict[str, Any] | None = field(default=None)

    @property
    def payload(self) -> dict[str, Any]:
        """The job's payload."""
        return self.job.payload

    @property
    def attempt(self) -> int:
        """1 on the first attempt."""
        return self.job.attempts

    @property
    def correlation_id(self) -> str:
        """The correlation id the job was enqueued with (bound while it runs)."""
        return self.job.correlation_id

    @property
    def idempotency_key(self) -> str:
        """The key under which this job's effect is recorded."""
        return self.job.idempotency_key


Handler = Callable[[JobContext], Awaitable[None]]
