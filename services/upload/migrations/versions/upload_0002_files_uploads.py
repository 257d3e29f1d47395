"""Files, shares, uploads and chunks.

Revision ID: upload_0002
Revises: upload_0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "upload_0002"
down_revision = "upload_0001"
branch_labels = None
depends_on = None


def _big_id() -> sa.types.TypeEngine[int]:
    # SQLite only autoincrements an INTEGER PRIMARY KEY.
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("parent_id", sa.String(32), sa.ForeignKey("files.id")),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("owner_user_id", sa.String(64), nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("children_version", sa.BigInteger, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("checksum", sa.String(128), nullable=False),
        sa.Column("checksum_algorithm", sa.String(16), nullable=False),
        sa.Column("blob_key", sa.String(255)),
        sa.Column("last_lock_token", sa.BigInteger, nullable=False),
        sa.Column("root_of", sa.String(140), unique=True),
        sa.Column("create_request_key", sa.String(300), unique=True),
        sa.Column("deleted_at", sa.DateTime),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_files_tenant_parent", "files", ["tenant_id", "parent_id", "name", "id"])
    op.create_table(
        "shares",
        sa.Column("file_id", sa.String(32), sa.ForeignKey("files.id"), primary_key=True),
        sa.Column("user_id", sa.String(64), primary_key=True),
        sa.Column("role", sa.String(8), nullable=False),
        sa.Column("granted_by", sa.String(64), nullable=False),
        sa.Column("granted_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "uploads",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("owner_user_id", sa.String(64), nullable=False),
        sa.Column("request_key", sa.String(300), unique=True),
        sa.Column("client_request_id", sa.String(128), nullable=False),
        sa.Column("file_id", sa.String(32), nullable=False),
        sa.Column("is_new_file", sa.Boolean, nullable=False),
        sa.Column("folder_id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("total_chunks", sa.Integer, nullable=False),
        sa.Column("total_size", sa.BigInteger, nullable=False),
        sa.Column("chunk_size", sa.BigInteger, nullable=False),
        sa.Column("checksum_algorithm", sa.String(16), nullable=False),
        sa.Column("expected_checksum", sa.String(128), nullable=False),
        sa.Column("received_chunk_count", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False),
        sa.Column("merge_started_at", sa.DateTime),
        sa.Column("merge_finished_at", sa.DateTime),
        sa.Column("file_version", sa.BigInteger, nullable=False),
        sa.Column("final_checksum", sa.String(128), nullable=False),
        sa.Column("failure_reason", sa.Text, nullable=False),
        sa.Column("chunks_purged_at", sa.DateTime),
    )
    op.create_index("ix_uploads_file_id", "uploads", ["file_id"])
    op.create_index("ix_uploads_owner", "uploads", ["tenant_id", "owner_user_id", "created_at"])
    op.create_index("ix_uploads_status_expires", "uploads", ["status", "expires_at"])
    op.create_table(
        "upload_chunks",
        sa.Column("id", _big_id(), primary_key=True, autoincrement=True),
        sa.Column("upload_id", sa.String(32), sa.ForeignKey("uploads.id"), nullable=False),
        sa.Column("chunk_index", sa.Integer, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("checksum", sa.String(128), nullable=False),
        sa.Column("blob_key", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        # Invariant 1: one row per (upload_id, chunk_index), enforced by the database.
        sa.UniqueConstraint("upload_id", "chunk_index", name="uq_upload_chunks_index"),
    )


def downgrade() -> None:
    op.drop_table("upload_chunks")
    op.drop_table("uploads")
    op.drop_table("shares")
    op.drop_table("files")
