"""PostgreSQL: identifier columns of the hot tables compare byte by byte (COLLATE "C").

Tenant, user, file and notification ids are opaque strings. Under a linguistic default
collation (the official postgres image's en_US.utf8, or ICU) every B-tree comparison of
them goes through the collation library, and a fan-out to 1,000 users compares them in 4
indexes of `notifications` and in the stream-position upsert: inserting 1,000 rows into a
table of 1,000,000 on an ICU en-US database took 38.4 ms with time-ordered ids, 30.0 with
them compared in "C" (`tests/benchmarks/bench_notification_ids.py --icu-locale en-US`).
Byte order is also the order Python's `sorted()` gives (UTF-8 keeps code-point order) and
SQLite's BINARY: the stream rows' global lock order (`fanout.lock_streams`, which sorts in
Python and locks with ORDER BY; the batch statement orders its ids with COLLATE "C") is
then one order whatever the server's default collation.

PostgreSQL rebuilds the indexes on these columns under an exclusive lock (the table itself
is not rewritten): on a large `notifications` table, run it in a maintenance window.
SQLite: nothing to do (it compares with BINARY already).

Revision ID: notify_0006
Revises: notify_0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "notify_0006"
down_revision = "notify_0005"
branch_labels = None
depends_on = None

_COLUMNS = {
    "notifications": (
        ("notification_id", 32),
        ("tenant_id", 128),
        ("user_id", 128),
        ("file_id", 128),
    ),
    "notify_user_streams": (("tenant_id", 128), ("user_id", 128)),
}


def _collate(collation: str | None) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in _COLUMNS.items():
        for column, length in columns:
            op.alter_column(
                table,
                column,
                type_=sa.String(length, collation=collation),
                existing_type=sa.String(length),
                existing_nullable=False,
            )


def upgrade() -> None:
    _collate("C")


def downgrade() -> None:
    # Without COLLATE, ALTER COLUMN ... TYPE gives the column its type's default collation.
    _collate(None)
