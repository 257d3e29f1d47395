"""Baseline of the upload service schema: its tables arrive in later revisions.

Revision ID: upload_0001
Revises:
Create Date: 2026-11-30
"""

revision = "upload_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
