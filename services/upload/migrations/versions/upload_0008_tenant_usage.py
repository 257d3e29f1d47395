"""tenant_usage: each tenant's stored bytes, kept by triggers on files, so the quota check
reads one row instead of summing every file of the tenant on each upload.

Revision ID: upload_0008
Revises: upload_0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "upload_0008"
down_revision = "upload_0007"
branch_labels = None
depends_on = None

# What a file row counts: its current version's size (folders count nothing).
_COUNTED = "(CASE WHEN {row}.kind = 'file' THEN {row}.size ELSE 0 END)"

_SQLITE_TRIGGERS = {
    "files_usage_insert": (
        "AFTER INSERT ON files",
        "NEW.tenant_id",
        _COUNTED.format(row="NEW"),
    ),
    "files_usage_update": (
        "AFTER UPDATE OF size, kind ON files",
        "NEW.tenant_id",
        f"{_COUNTED.format(row='NEW')} - {_COUNTED.format(row='OLD')}",
    ),
    "files_usage_delete": (
        "AFTER DELETE ON files",
        "OLD.tenant_id",
        f"-{_COUNTED.format(row='OLD')}",
    ),
}

_PG_FUNCTION = f"""
CREATE FUNCTION files_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    delta BIGINT := 0;
    tenant VARCHAR;
BEGIN
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        delta := delta + {_COUNTED.format(row="NEW")};
        tenant := NEW.tenant_id;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        delta := delta - {_COUNTED.format(row="OLD")};
        tenant := OLD.tenant_id;
    END IF;
    IF delta <> 0 THEN
        INSERT INTO tenant_usage (tenant_id, stored_bytes) VALUES (tenant, delta)
        ON CONFLICT (tenant_id) DO UPDATE SET stored_bytes = tenant_usage.stored_bytes + delta;
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "tenant_usage",
        sa.Column("tenant_id", sa.String(64), primary_key=True),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
    )
    op.execute(
        "INSERT INTO tenant_usage (tenant_id, stored_bytes)"
        " SELECT tenant_id, SUM(size) FROM files WHERE kind = 'file' GROUP BY tenant_id"
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER files_usage AFTER INSERT OR DELETE OR UPDATE OF size, kind"
            " ON files FOR EACH ROW EXECUTE FUNCTION files_usage()"
        )
        return
    for name, (when, tenant, delta) in _SQLITE_TRIGGERS.items():
        op.execute(
            f"CREATE TRIGGER {name} {when} FOR EACH ROW WHEN {delta} <> 0 BEGIN"
            f" INSERT INTO tenant_usage (tenant_id, stored_bytes) VALUES ({tenant}, {delta})"
            " ON CONFLICT (tenant_id) DO UPDATE SET"
            f" stored_bytes = tenant_usage.stored_bytes + ({delta}); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER files_usage ON files")
        op.execute("DROP FUNCTION files_usage()")
    else:
        for name in _SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER {name}")
    op.drop_table("tenant_usage")
