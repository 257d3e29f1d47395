"""Sync engine: linked drives with delta cursors, synced items with status and expiry.

Revision ID: sync_0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "sync_0001"
down_revision = None
branch_labels = None
depends_on = None

Utc = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sync_linked_drives",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("account_id", sa.String(128), nullable=False),
        sa.Column("upstream_drive_id", sa.String(255), nullable=False),
        sa.Column("folder_id", sa.String(32), nullable=True),
        sa.Column("delta_link", sa.Text(), nullable=True),
        sa.Column("last_delta_at", Utc, nullable=True),
        sa.Column("last_full_resync_at", Utc, nullable=True),
        sa.Column("full_resync_count", sa.Integer(), nullable=False),
        sa.Column("created_at", Utc, nullable=False),
        sa.Column("updated_at", Utc, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sync_linked_drives"),
        sa.UniqueConstraint(
            "account_id", "upstream_drive_id", name="uq_sync_linked_drives_upstream"
        ),
    )
    op.create_index(
        "ix_sync_linked_drives_upstream_drive_id", "sync_linked_drives", ["upstream_drive_id"]
    )
    op.create_table(
        "sync_synced_items",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("account_id", sa.String(128), nullable=False),
        sa.Column("upstream_drive_id", sa.String(255), nullable=False),
        sa.Column("upstream_item_id", sa.String(255), nullable=False),
        sa.Column("drive_id", sa.String(32), nullable=True),
        sa.Column("file_id", sa.String(32), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("etag", sa.String(255), nullable=False),
        sa.Column("upstream_modified_at", Utc, nullable=True),
        sa.Column("expires_at", Utc, nullable=True),
        sa.Column("tombstoned_at", Utc, nullable=True),
        sa.Column("tombstone_reason", sa.String(16), nullable=True),
        sa.Column("retry_count", sa.Integer(), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("next_retry_at", Utc, nullable=True),
        sa.Column("cache_key", sa.String(255), nullable=True),
        sa.Column("last_synced_at", Utc, nullable=True),
        sa.Column("created_at", Utc, nullable=False),
        sa.Column("updated_at", Utc, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sync_synced_items"),
        sa.UniqueConstraint("account_id", "upstream_item_id", name="uq_sync_synced_items_upstream"),
    )
    op.create_index(
        "ix_sync_synced_items_status_expires_at", "sync_synced_items", ["status", "expires_at"]
    )
    op.create_index(
        "ix_sync_synced_items_status_tombstoned_at",
        "sync_synced_items",
        ["status", "tombstoned_at"],
    )
    op.create_index("ix_sync_synced_items_file_id", "sync_synced_items", ["file_id"])
    op.create_index("ix_sync_synced_items_drive_id", "sync_synced_items", ["drive_id"])


def downgrade() -> None:
    op.drop_table("sync_synced_items")
    op.drop_table("sync_linked_drives")
