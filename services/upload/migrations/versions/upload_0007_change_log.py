"""file_change_heads, file_changes: the per-tenant change log behind ListChanges.

Revision ID: upload_0007
Revises: upload_0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "upload_0007"
down_revision = "upload_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "file_change_heads",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("purged_through", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "file_changes",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("file_id", sa.String(32), nullable=False),
        sa.Column("event_type", sa.String(32), nullable=False),
        sa.Column("via_folder", sa.Boolean, nullable=False),
        sa.Column("named", sa.Boolean, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_file_changes_created", "file_changes", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_file_changes_created", "file_changes")
    op.drop_table("file_changes")
    op.drop_table("file_change_heads")
