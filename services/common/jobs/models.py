"""Tables of the job queue: jobs, applied_jobs (idempotency), dead_letters, periodic_ticks.

They live on their own `MetaData` (the runtime's, shared with the outbox) so every
service that embeds the runtime gets the same schema from `runtime_migrations/`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.types import TypeDecorator

from services.common.db import new_metadata, sqlite_utc_text

metadata = new_metadata()

# A W3C traceparent (version 00) is 55 characters; room for a later version's fields.
TRACEPARENT_LEN = 64
# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias), not a BIGINT one.
Id = BigInteger().with_variant(Integer(), "sqlite")


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on both backends.

    SQLite stores naive text that sorts lexically (so `<` in SQL works as long as every
    value is UTC); PostgreSQL stores `timestamptz`. Reads always come back UTC-aware.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Any:
        # SQLite: one call to text (`db.sqlite_utc_text`), as the two processors would write.
        if dialect.name == "sqlite":
            return sqlite_utc_text
        return super().bind_processor(dialect)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    """Now, aware, in UTC."""
    return datetime.now(UTC)


# status: 'queued' (due at run_after; a partition's first two jobs), 'waiting' (two or
# more behind its partition's head: claims skip it; runtime_0003) or 'running' (leased).
# Finished jobs are deleted, dead ones move to dead_letters: every row here is
# unfinished, which is what makes the per-partition rule "no earlier row with my
# partition_key" exact.
QUEUED, WAITING, RUNNING = "queued", "waiting", "running"
jobs = Table(
    "jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", String(36), nullable=False, unique=True),
    Column("job_type", String(100), nullable=False),
    Column("partition_key", String(255), nullable=False),
    Column("idempotency_key", String(255), nullable=False),
    # Non-NULL only while the job is queued and never started: the dedupe window's key.
    Column("dedupe_key", String(255), nullable=True),
    Column("payload", JSON, nullable=False),
    Column("correlation_id", String(128), nullable=False),
    # W3C traceparent of the span that enqueued it, continued by the worker (runtime_0005).
    Column("traceparent", String(TRACEPARENT_LEN), nullable=True),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("collapsed", Integer, nullable=False, default=0),
    Column("run_after", UtcDateTime, nullable=False),
    Column("enqueued_at", UtcDateTime, nullable=False),
    Column("first_attempt_at", UtcDateTime, nullable=True),
    Column("last_attempt_at", UtcDateTime, nullable=True),
    Column("claimed_by", String(255), nullable=True),
    Column("lease_token", String(36), nullable=True),
    Column("lease_expires_at", UtcDateTime, nullable=True),
    Column("last_error_class", String(32), nullable=True),
    Column("last_error_message", Text, nullable=True),
    # One open (not yet started) job per (job_type, dedupe_key); NULLs never collide.
    UniqueConstraint("job_type", "dedupe_key", name="uq_jobs_job_type_dedupe_key"),
    # The per-partition "is there an earlier job?" probe.
    Index("ix_jobs_partition_key_id", "partition_key", "id"),
    # Claim scan: ready queued jobs and expired leases.
    Index("ix_jobs_status_run_after", "status", "run_after"),
    # The claim's oldest-first scan over partition heads only (runtime_0003): the jobs
    # waiting behind them are not in it.
    Index(
        "ix_jobs_claimable",
        "id",
        postgresql_where=text("status IN ('queued', 'running')"),
        sqlite_where=text("status IN ('queued', 'running')"),
    ),
)

applied_jobs = Table(
    "applied_jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(255), nullable=False, unique=True),
    Column("job_type", String(100), nullable=False),
    Column("job_id", String(36), nullable=False),
    # What the handler reported doing (small JSON summary), for audits and replays.
    Column("effect", JSON, nullable=True),
    Column("applied_at", UtcDateTime, nullable=False),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", String(36), nullable=False),
    Column("job_type", String(100), nullable=False),
    Column("partition_key", String(255), nullable=False),
    Column("idempotency_key", String(255), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("correlation_id", String(128), nullable=False),
    Column("error_class", String(32), nullable=False),
    Column("error_type", String(255), nullable=False),
    Column("error_message", Text, nullable=False),
    Column("traceback", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("worker_id", String(255), nullable=False),
    Column("first_attempt_at", UtcDateTime, nullable=True),
    Column("last_attempt_at", UtcDateTime, nullable=True),
    Column("enqueued_at", UtcDateTime, nullable=False),
    Column("dead_at", UtcDateTime, nullable=False),
    Column("replayed_at", UtcDateTime, nullable=True),
    Column("replay_job_id", String(36), nullable=True),
    Index("ix_dead_letters_job_type_id", "job_type", "id"),
)

# One row per (job_type, tick): the unique constraint lets exactly one replica enqueue a tick.
periodic_ticks = Table(
    "periodic_ticks",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_type", String(100), nullable=False),
    Column("tick", BigInteger, nullable=False),
    Column("scheduled_by", String(255), nullable=False),
    Column("scheduled_at", UtcDateTime, nullable=False),
    UniqueConstraint("job_type", "tick", name="uq_periodic_ticks_job_type_tick"),
)
