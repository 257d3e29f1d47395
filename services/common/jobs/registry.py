"""Which handler runs each job type, with its retry policy and dedupe window."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from services.common.jobs.job import Handler, NewJob
from services.common.jobs.retry import RetryPolicy


@dataclass(frozen=True, slots=True)
class JobType:
    """One job type: its handler, retry policy and dedupe window (0: no collapsing)."""

    name: str
    handler: Handler
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    dedupe_window_seconds: float = 0.0


class JobRegistry:
    """job_type -> JobType. A service builds one in its app.py and hands it to the runtime."""

    def __init__(self) -> None:
        self._types: dict[str, JobType] = {}

    def register(
        self,
        name: str,
        handler: Handler,
        *,
        retry: RetryPolicy | None = None,
        dedupe_window_seconds: float = 0.0,
    ) -> JobType:
        """Add a job type; registering a name twice is a programming error."""
        if name in self._types:
            raise ValueError(f"job type {name!r} is already registered")
        job_type = JobType(name, handler, retry or RetryPolicy(), dedupe_window_seconds)
        self._types[name] = job_type
        return job_type

    def get(self, name: str) -> JobType | None:
        """The job type called `name`, or None."""
        return self._types.get(name)

    @property
    def names(self) -> list[str]:
        """Registered job type names, sorted."""
        return sorted(self._types)

    def new_job(
        self,
        job_type: str,
        payload: dict[str, Any],
        *,
        partition_key: str,
        idempotency_key: str,
        dedupe_key: str | None = None,
        correlation_id: str | None = None,
        run_after: datetime | None = None,
    ) -> NewJob:
        """A `NewJob` of a registered type, with that type's dedupe window filled in."""
        registered = self._types.get(job_type)
        if registered is None:
            raise KeyError(f"unknown job type {job_type!r}")
        return NewJob(
            job_type=job_type,
            payload=payload,
            partition_key=partition_key,
            idempotency_key=idempotency_key,
            dedupe_key=dedupe_key,
            dedupe_window_seconds=registered.dedupe_window_seconds,
            correlation_id=correlation_id,
            run_after=run_after,
        )
