"""upload_chunks.attempts: sends of a chunk index that reached its row (the logs' attempt).

Revision ID: upload_0004
Revises: upload_0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "upload_0004"
down_revision = "upload_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("upload_chunks") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("upload_chunks") as batch:
        batch.drop_column("attempts")
