"""Two fewer index entries per new notification: a fan-out to 1,000 users writes 1,000 rows,
and each index costs each row a B-tree insert at that user's place in it.

- `ix_notifications_user_file_seq` goes: the digest's "latest notification of this user
  for this file" is the one with the highest version, found on UNIQUE (tenant, user,
  file, version). A user's notifications about a file take increasing versions and
  increasing stream positions together: events are applied in version order per
  aggregate (invariant 10), a fold moves both forward, and Ingest refuses an event whose
  payload names another file than its aggregate (`inbox.validate`).
- `ix_notifications_read_at` covers read rows only (`WHERE read_at IS NOT NULL`): the
  retention sweep deletes read rows older than its cutoff and says so in its WHERE; a new
  notification is unread, so it is no longer inserted there at all.

Revision ID: notify_0004
Revises: notify_0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "notify_0004"
down_revision = "notify_0003"
branch_labels = None
depends_on = None

_READ = sa.text("read_at IS NOT NULL")


def upgrade() -> None:
    op.drop_index("ix_notifications_user_file_seq", table_name="notifications")
    op.drop_index("ix_notifications_read_at", table_name="notifications")
    op.create_index(
        "ix_notifications_read_at",
        "notifications",
        ["read_at"],
        postgresql_where=_READ,
        sqlite_where=_READ,
    )


def downgrade() -> None:
    op.drop_index("ix_notifications_read_at", table_name="notifications")
    op.create_index("ix_notifications_read_at", "notifications", ["read_at"])
    op.create_index(
        "ix_notifications_user_file_seq",
        "notifications",
        ["tenant_id", "user_id", "file_id", "seq"],
    )
