"""rate_limit_counters: per (key, window) call counts every replica of a service shares.

UNLOGGED on PostgreSQL: a count is worth one window, so it skips the WAL (a crash empties
the table: every caller gets a fresh window once). On SQLite the table exists but stays
empty: a SQLite service has one replica and counts in memory (`rate_limits.database_store`).

Revision ID: rate_limits_0001
Revises:
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "rate_limits_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "rate_limit_counters",
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("window_index", sa.BigInteger, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        # What the last statement added (postgres_store.TAKE returns it).
        sa.Column("granted", sa.Integer, nullable=False),
        # Epoch seconds after which the row is purged (one window after its own ends).
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("key", "window_index"),
        prefixes=["UNLOGGED"] if postgresql else [],
    )


def downgrade() -> None:
    op.drop_table("rate_limit_counters")
