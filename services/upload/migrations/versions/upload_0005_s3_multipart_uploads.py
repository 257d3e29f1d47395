"""s3_multipart_uploads: S3 multipart uploads started by a merge and not yet finished, so a
re-run merge or the reclaim sweep can abort one a killed merge left behind.

Revision ID: upload_0005
Revises: upload_0004
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "upload_0005"
down_revision = "upload_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "s3_multipart_uploads",
        sa.Column("upload_id", sa.String(1024), primary_key=True),
        sa.Column("object_key", sa.String(255), nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_s3_multipart_uploads_object_key", "s3_multipart_uploads", ["object_key"])


def downgrade() -> None:
    op.drop_index("ix_s3_multipart_uploads_object_key", "s3_multipart_uploads")
    op.drop_table("s3_multipart_uploads")
