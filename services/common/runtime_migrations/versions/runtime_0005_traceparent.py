"""A nullable `traceparent` on jobs and outbox events: traces cross the database.

A job or an outbox event written while a traced request runs stores that span's W3C
traceparent; the worker that runs the job and the relay that publishes the event continue
the same trace (`services/common/tracing.py`), so one trace goes from the upload's RPC
through the merge job and the outbox to notify's Ingest and its fan-out job. NULL when
tracing is off or the row was written before this revision.

Revision ID: runtime_0005
Revises: runtime_0004
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "runtime_0005"
down_revision = "runtime_0004"
branch_labels = None
depends_on = None

_TABLES = ("jobs", "outbox_events")


def upgrade() -> None:
    for table in _TABLES:
        # A nullable column with no default: a catalog-only change on PostgreSQL, no rewrite.
        op.add_column(table, sa.Column("traceparent", sa.String(64), nullable=True))


def downgrade() -> None:
    # SQLite 3.35+ drops a column in place (no table copy, the triggers stay).
    for table in _TABLES:
        op.drop_column(table, "traceparent")
