"""Tenant-scoped uniqueness: (tenant, account, upstream id), and (file, tenant) lookups.

Before this, two tenants could not link the same provider account's drive or item, and
delta lookups by (account, upstream id) could land on another tenant's row.

Revision ID: sync_0002
Revises: sync_0001
Create Date: 2026-12-01
"""

from alembic import op

revision = "sync_0002"
down_revision = "sync_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch: SQLite rebuilds the table (it cannot drop a constraint in place).
    with op.batch_alter_table("sync_linked_drives") as batch:
        batch.drop_constraint("uq_sync_linked_drives_upstream", type_="unique")
        batch.create_unique_constraint(
            "uq_sync_linked_drives_upstream", ["tenant_id", "account_id", "upstream_drive_id"]
        )
    with op.batch_alter_table("sync_synced_items") as batch:
        batch.drop_constraint("uq_sync_synced_items_upstream", type_="unique")
        batch.create_unique_constraint(
            "uq_sync_synced_items_upstream", ["tenant_id", "account_id", "upstream_item_id"]
        )
        batch.drop_index("ix_sync_synced_items_file_id")
        batch.create_index("ix_sync_synced_items_file_id", ["file_id", "tenant_id"])


def downgrade() -> None:
    with op.batch_alter_table("sync_synced_items") as batch:
        batch.drop_index("ix_sync_synced_items_file_id")
        batch.create_index("ix_sync_synced_items_file_id", ["file_id"])
        batch.drop_constraint("uq_sync_synced_items_upstream", type_="unique")
        batch.create_unique_constraint(
            "uq_sync_synced_items_upstream", ["account_id", "upstream_item_id"]
        )
    with op.batch_alter_table("sync_linked_drives") as batch:
        batch.drop_constraint("uq_sync_linked_drives_upstream", type_="unique")
        batch.create_unique_constraint(
            "uq_sync_linked_drives_upstream", ["account_id", "upstream_drive_id"]
        )
