"""uploads.content_purged_at: when the storage lifecycle deleted the upload's merged bytes.

Revision ID: upload_0003
Revises: upload_0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "upload_0003"
down_revision = "upload_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("uploads") as batch:
        batch.add_column(sa.Column("content_purged_at", sa.DateTime))


def downgrade() -> None:
    with op.batch_alter_table("uploads") as batch:
        batch.drop_column("content_purged_at")
