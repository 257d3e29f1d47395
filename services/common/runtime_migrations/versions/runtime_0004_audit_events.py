"""audit_events: the audit trail (services/common/audit), one row per change of access or
content, written in the change's transaction; purged by the runtime_retention job.

Revision ID: runtime_0004
Revises: runtime_0003
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

from services.common.jobs.models import Id, UtcDateTime

revision = "runtime_0004"
down_revision = "runtime_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("at", UtcDateTime, nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("principal", sa.String(140), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target_type", sa.String(32), nullable=False),
        sa.Column("target_id", sa.String(255), nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_events"),
    )
    op.create_index("ix_audit_events_tenant_id_at", "audit_events", ["tenant_id", "at"])
    op.create_index("ix_audit_events_principal_at", "audit_events", ["principal", "at"])
    op.create_index("ix_audit_events_target_id_at", "audit_events", ["target_id", "at"])
    op.create_index("ix_audit_events_at", "audit_events", ["at"])


def downgrade() -> None:
    op.drop_table("audit_events")
