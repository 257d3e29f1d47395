"""Inbox, applied versions per aggregate, per-user streams and notifications.

Revision ID: notify_0002
Revises: notify_0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "notify_0002"
down_revision = "notify_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notify_inbox",
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("aggregate_id", sa.String(128), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("event", sa.LargeBinary(), nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("event_id", name="pk_notify_inbox"),
    )
    op.create_index(
        "ix_notify_inbox_aggregate_status_version",
        "notify_inbox",
        ["aggregate_id", "status", "version"],
    )
    op.create_index("ix_notify_inbox_finished_at", "notify_inbox", ["finished_at"])
    op.create_table(
        "notify_aggregate_versions",
        sa.Column("aggregate_id", sa.String(128), nullable=False),
        sa.Column("applied_version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("aggregate_id", name="pk_notify_aggregate_versions"),
    )
    op.create_table(
        "notify_user_streams",
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "user_id", name="pk_notify_user_streams"),
    )
    op.create_table(
        "notifications",
        sa.Column("notification_id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("file_id", sa.String(128), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("event_id", sa.String(128), nullable=False),
        sa.Column("actor_user_id", sa.String(128), nullable=False),
        sa.Column("file_name", sa.String(1024), nullable=False),
        sa.Column("summary", sa.String(2048), nullable=False),
        sa.Column("dedupe_key", sa.String(256), nullable=False),
        sa.Column("digest_count", sa.Integer(), nullable=False),
        sa.Column("window_started_at", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("read_at", sa.DateTime(), nullable=True),
        sa.Column("correlation_id", sa.String(128), nullable=False),
        sa.PrimaryKeyConstraint("notification_id", name="pk_notifications"),
        sa.UniqueConstraint(
            "tenant_id", "user_id", "file_id", "version", name="uq_notifications_user_file_version"
        ),
        sa.UniqueConstraint("tenant_id", "user_id", "seq", name="uq_notifications_user_seq"),
    )
    op.create_index(
        "ix_notifications_user_read", "notifications", ["tenant_id", "user_id", "read_at"]
    )
    op.create_index(
        "ix_notifications_user_file_seq",
        "notifications",
        ["tenant_id", "user_id", "file_id", "seq"],
    )
    op.create_index("ix_notifications_read_at", "notifications", ["read_at"])


def downgrade() -> None:
    op.drop_table("notifications")
    op.drop_table("notify_user_streams")
    op.drop_table("notify_aggregate_versions")
    op.drop_table("notify_inbox")
