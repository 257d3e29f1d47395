"""tus_uploads: the tus 1.0 endpoint's upload resources (services/upload/tus/).

Revision ID: upload_0006
Revises: upload_0005
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "upload_0006"
down_revision = "upload_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tus_uploads",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("owner_user_id", sa.String(64), nullable=False),
        # No foreign key: the storage lifecycle deletes the rows of purged uploads.
        sa.Column("upload_id", sa.String(32)),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("length", sa.BigInteger),
        sa.Column("chunk_size", sa.BigInteger, nullable=False),
        sa.Column("pieces", sa.Integer, nullable=False),
        sa.Column("upload_metadata", sa.Text, nullable=False),
        sa.Column("concat", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False),
        sa.Column("terminated_at", sa.DateTime),
    )
    op.create_index("ix_tus_uploads_owner", "tus_uploads", ["tenant_id", "owner_user_id"])
    op.create_index("ix_tus_uploads_expires", "tus_uploads", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_tus_uploads_expires", "tus_uploads")
    op.drop_index("ix_tus_uploads_owner", "tus_uploads")
    op.drop_table("tus_uploads")
