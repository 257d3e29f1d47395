"""Linked drives gain an owner (files found by delta belong to them) and a subscription.

`owner_user_id` / `linked_by`: who owns the files a delta discovers (the linked folder's
owner at link time) and who linked the drive (the actor of their events). Rows from
before stay NULL: such a drive keeps recording synced items without creating files.
`subscription_id` / `subscription_expires_at`: the provider's change subscription for
the drive, created and renewed by `upload.sync.subscription` jobs.

Revision ID: sync_0003
Revises: sync_0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "sync_0003"
down_revision = "sync_0002"
branch_labels = None
depends_on = None

Utc = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("sync_linked_drives") as batch:
        batch.add_column(sa.Column("owner_user_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("linked_by", sa.String(64), nullable=True))
        batch.add_column(sa.Column("subscription_id", sa.String(255), nullable=True))
        batch.add_column(sa.Column("subscription_expires_at", Utc, nullable=True))
        batch.create_index("ix_sync_linked_drives_subscription_id", ["subscription_id"])


def downgrade() -> None:
    with op.batch_alter_table("sync_linked_drives") as batch:
        batch.drop_index("ix_sync_linked_drives_subscription_id")
        batch.drop_column("subscription_expires_at")
        batch.drop_column("subscription_id")
        batch.drop_column("linked_by")
        batch.drop_column("owner_user_id")
