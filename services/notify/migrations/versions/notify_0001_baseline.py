"""Baseline of the notify service schema: its tables arrive in later revisions.

Revision ID: notify_0001
Revises:
Create Date: 2026-11-30
"""

revision = "notify_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
