"""Tables of the sync engine: linked drives (with their delta cursor) and synced items.

Every row carries its tenant, and every uniqueness and lookup includes it: two tenants
may link the same provider account and ids without ever seeing each other's rows.

They sit on their own `MetaData` and Alembic folder (`sync/migrations`, version table
`alembic_version_upload_sync`). A synced item names the upload service's file by id only.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from services.common.db import new_metadata
from services.common.jobs.models import UtcDateTime, utcnow

__all__ = ["linked_drives", "metadata", "synced_items", "utcnow"]

metadata = new_metadata()

# Sync statuses. TOMBSTONED is terminal: nothing moves an item out of it.
SYNCED, PENDING_RETRY, TOMBSTONED = "SYNCED", "PENDING_RETRY", "TOMBSTONED"
# Why an item was tombstoned.
GONE, EXPIRED, REMOVED = "gone", "expired", "removed"

linked_drives = Table(
    "sync_linked_drives",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("tenant_id", String(64), nullable=False),
    Column("account_id", String(128), nullable=False),
    Column("upstream_drive_id", String(255), nullable=False),
    # Local folder the drive mirrors into (the upload service's files.id), if any.
    Column("folder_id", String(32), nullable=True),
    # The last @odata.deltaLink: where the next poll starts. NULL: enumerate in full.
    Column("delta_link", Text, nullable=True),
    Column("last_delta_at", UtcDateTime, nullable=True),
    Column("last_full_resync_at", UtcDateTime, nullable=True),
    Column("full_resync_count", Integer, nullable=False, default=0),
    # Owner of the files a delta discovers (the folder's owner at link time) and the user
    # who linked the drive (their events' actor). NULL on older links: no files created.
    Column("owner_user_id", String(64), nullable=True),
    Column("linked_by", String(64), nullable=True),
    # The provider's change subscription for this drive (created and renewed by jobs).
    Column("subscription_id", String(255), nullable=True),
    Column("subscription_expires_at", UtcDateTime, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    UniqueConstraint(
        "tenant_id", "account_id", "upstream_drive_id", name="uq_sync_linked_drives_upstream"
    ),
    Index("ix_sync_linked_drives_upstream_drive_id", "upstream_drive_id"),
    Index("ix_sync_linked_drives_subscription_id", "subscription_id"),
)

synced_items = Table(
    "sync_synced_items",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("tenant_id", String(64), nullable=False),
    Column("account_id", String(128), nullable=False),
    Column("upstream_drive_id", String(255), nullable=False),
    Column("upstream_item_id", String(255), nullable=False),
    # sync_linked_drives.id when the item came from (or belongs to) a linked drive.
    Column("drive_id", String(32), nullable=True),
    # The upload service's files.id (plain column: that table is theirs); NULL while the
    # item is known upstream but not materialised as a local file.
    Column("file_id", String(32), nullable=True),
    Column("status", String(16), nullable=False),
    Column("name", String(255), nullable=False, default=""),
    Column("size", BigInteger, nullable=False, default=0),
    Column("etag", String(255), nullable=False, default=""),
    Column("upstream_modified_at", UtcDateTime, nullable=True),
    # Retention end announced by the provider: past it the item is tombstoned offline.
    Column("expires_at", UtcDateTime, nullable=True),
    Column("tombstoned_at", UtcDateTime, nullable=True),
    Column("tombstone_reason", String(16), nullable=True),
    # Consecutive 404s; reset by a 200.
    Column("retry_count", Integer, nullable=False, default=0),
    Column("last_status_code", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("next_retry_at", UtcDateTime, nullable=True),
    # Key of the locally cached bytes, evicted when the item is tombstoned.
    Column("cache_key", String(255), nullable=True),
    Column("last_synced_at", UtcDateTime, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    UniqueConstraint(
        "tenant_id", "account_id", "upstream_item_id", name="uq_sync_synced_items_upstream"
    ),
    # Offline expiry sweep and purge: "not tombstoned and expired", "tombstoned long ago".
    Index("ix_sync_synced_items_status_expires_at", "status", "expires_at"),
    Index("ix_sync_synced_items_status_tombstoned_at", "status", "tombstoned_at"),
    # Tombstone lookups behind GetFile/Download/ListFolder: (file, tenant).
    Index("ix_sync_synced_items_file_id", "file_id", "tenant_id"),
    Index("ix_sync_synced_items_drive_id", "drive_id"),
)
