"""Retired aggregates: `notify_aggregate_versions.retired_at`, set when the aggregate's
terminal event (`file.purged`: the upload service deleted the file for good) is applied.
Every later event of it is then skipped as old, and the retention job deletes the row
once it has been retired longer than `SERENTAK_RETIRED_AGGREGATE_RETENTION_SECONDS`
(`services/notify/retirement.py`): the table stops growing by one row per file ever
notified. A partial index on the retired rows serves the sweep; live rows have no entry.

Revision ID: notify_0008
Revises: notify_0007
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "notify_0008"
down_revision = "notify_0007"
branch_labels = None
depends_on = None

_RETIRED = sa.text("retired_at IS NOT NULL")


def upgrade() -> None:
    op.add_column(
        "notify_aggregate_versions", sa.Column("retired_at", sa.DateTime(), nullable=True)
    )
    op.create_index(
        "ix_notify_aggregate_versions_retired_at",
        "notify_aggregate_versions",
        ["retired_at"],
        postgresql_where=_RETIRED,
        sqlite_where=_RETIRED,
    )


def downgrade() -> None:
    op.drop_index("ix_notify_aggregate_versions_retired_at", table_name="notify_aggregate_versions")
    with op.batch_alter_table("notify_aggregate_versions") as batch:
        batch.drop_column("retired_at")
