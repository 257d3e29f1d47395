"""Job runtime tables: jobs, applied_jobs, dead_letters, periodic_ticks, outbox, relay leases.

Revision ID: runtime_0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from services.common.jobs.models import Id, UtcDateTime

revision = "runtime_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("job_type", sa.String(100), nullable=False),
        sa.Column("partition_key", sa.String(255), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("dedupe_key", sa.String(255), nullable=True),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("collapsed", sa.Integer, nullable=False),
        sa.Column("run_after", UtcDateTime, nullable=False),
        sa.Column("enqueued_at", UtcDateTime, nullable=False),
        sa.Column("first_attempt_at", UtcDateTime, nullable=True),
        sa.Column("last_attempt_at", UtcDateTime, nullable=True),
        sa.Column("claimed_by", sa.String(255), nullable=True),
        sa.Column("lease_token", sa.String(36), nullable=True),
        sa.Column("lease_expires_at", UtcDateTime, nullable=True),
        sa.Column("last_error_class", sa.String(32), nullable=True),
        sa.Column("last_error_message", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("job_id", name="uq_jobs_job_id"),
        sa.UniqueConstraint("job_type", "dedupe_key", name="uq_jobs_job_type_dedupe_key"),
    )
    op.create_index("ix_jobs_partition_key_id", "jobs", ["partition_key", "id"])
    op.create_index("ix_jobs_status_run_after", "jobs", ["status", "run_after"])

    op.create_table(
        "applied_jobs",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("job_type", sa.String(100), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("effect", sa.JSON, nullable=True),
        sa.Column("applied_at", UtcDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_applied_jobs"),
        sa.UniqueConstraint("idempotency_key", name="uq_applied_jobs_idempotency_key"),
    )

    op.create_table(
        "dead_letters",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("job_type", sa.String(100), nullable=False),
        sa.Column("partition_key", sa.String(255), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=False),
        sa.Column("error_class", sa.String(32), nullable=False),
        sa.Column("error_type", sa.String(255), nullable=False),
        sa.Column("error_message", sa.Text, nullable=False),
        sa.Column("traceback", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("worker_id", sa.String(255), nullable=False),
        sa.Column("first_attempt_at", UtcDateTime, nullable=True),
        sa.Column("last_attempt_at", UtcDateTime, nullable=True),
        sa.Column("enqueued_at", UtcDateTime, nullable=False),
        sa.Column("dead_at", UtcDateTime, nullable=False),
        sa.Column("replayed_at", UtcDateTime, nullable=True),
        sa.Column("replay_job_id", sa.String(36), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_dead_letters"),
    )
    op.create_index("ix_dead_letters_job_type_id", "dead_letters", ["job_type", "id"])

    op.create_table(
        "periodic_ticks",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_type", sa.String(100), nullable=False),
        sa.Column("tick", sa.BigInteger, nullable=False),
        sa.Column("scheduled_by", sa.String(255), nullable=False),
        sa.Column("scheduled_at", UtcDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_periodic_ticks"),
        sa.UniqueConstraint("job_type", "tick", name="uq_periodic_ticks_job_type_tick"),
    )

    op.create_table(
        "outbox_events",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("aggregate_type", sa.String(64), nullable=False),
        sa.Column("aggregate_id", sa.String(255), nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("event_type", sa.String(128), nullable=False),
        sa.Column("event", sa.LargeBinary, nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=False),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("published_at", UtcDateTime, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbox_events"),
        sa.UniqueConstraint("event_id", name="uq_outbox_events_event_id"),
    )
    op.create_index(
        "ix_outbox_events_aggregate", "outbox_events", ["aggregate_type", "aggregate_id", "id"]
    )
    op.create_index("ix_outbox_events_published_at_id", "outbox_events", ["published_at", "id"])

    op.create_table(
        "relay_leases",
        sa.Column("aggregate_key", sa.String(330), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("lease_token", sa.String(36), nullable=False),
        sa.Column("expires_at", UtcDateTime, nullable=False),
        sa.PrimaryKeyConstraint("aggregate_key", name="pk_relay_leases"),
    )


def downgrade() -> None:
    for table in (
        "relay_leases",
        "outbox_events",
        "periodic_ticks",
        "dead_letters",
        "applied_jobs",
        "jobs",
    ):
        op.drop_table(table)
