"""What a job handler raises to tell the runtime what to do next.

Every class descends from `JobError`. A handler that raises anything else has a bug: the
runtime retries it like a transient failure (the bug may be a race) and dead-letters it
after the last attempt, with the traceback.

| raised                          | error class | retried?                                   |
| ------------------------------- | ----------- | ------------------------------------------ |
| `TransientError`                | transient   | yes, backoff with jitter                   |
| `RetryLater` / `ConflictError`  | conflict    | yes; `retry_after` is a floor on the delay |
| `PermanentError`                | permanent   | never: dead-lettered at once               |
| anything else                   | bug         | yes, then dead-lettered                    |
"""

from __future__ import annotations

from typing import ClassVar

TRANSIENT = "transient"
CONFLICT = "conflict"
PERMANENT = "permanent"
BUG = "bug"


class JobError(Exception):
    """Root of the errors a handler raises on purpose."""

    error_class: ClassVar[str] = BUG

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        # Seconds the caller asked us to wait (e.g. an HTTP Retry-After); a floor on the delay.
        self.retry_after = retry_after


class TransientError(JobError):
    """A dependency failed in a way that may pass (timeout, 503, connection reset)."""

    error_class = TRANSIENT


class RetryLater(JobError):
    """The job arrived before what it needs (e.g. an event ahead of its data): try later."""

    error_class = CONFLICT


class ConflictError(RetryLater):
    """A lost race or version conflict; retrying later should succeed."""


class PermanentError(JobError):
    """The job can never succeed (bad payload, 410 Gone): no retry, dead-letter now."""

    error_class = PERMANENT


class LeaseLost(Exception):
    """The job's lease ended and someone else may own it: this worker must not finish it.

    Internal to the runtime; handlers never raise it.
    """


def error_class_of(exc: BaseException) -> str:
    """transient, conflict, permanent or bug."""
    return exc.error_class if isinstance(exc, JobError) else BUG


def retry_after_of(exc: BaseException) -> float | None:
    """The Retry-After hint carried by `exc`, if any."""
    return exc.retry_after if isinstance(exc, JobError) else None
