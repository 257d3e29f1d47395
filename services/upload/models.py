"""Tables of the upload service (SQLAlchemy 2 declarative).

Times are stored as naive UTC and read back as aware UTC (`UtcDateTime`), so SQLite and
PostgreSQL behave the same.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.db import new_metadata, sqlite_utc_text

metadata = new_metadata()


class Base(DeclarativeBase):
    """Declarative base bound to the service's metadata."""

    metadata = metadata


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, naive UTC in the database."""

    impl = DateTime
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Any:
        # SQLite: one call to text (`db.sqlite_utc_text`), as the two processors would write.
        if dialect.name == "sqlite":
            return sqlite_utc_text
        return super().bind_processor(dialect)

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def utcnow() -> datetime:
    """The current time, aware UTC."""
    return datetime.now(UTC)


# Upload statuses (invariant 5: only forward).
UPLOADING, MERGING, COMPLETED, FAILED, ABORTED, EXPIRED = (
    "uploading",
    "merging",
    "completed",
    "failed",
    "aborted",
    "expired",
)
FILE, FOLDER = "file", "folder"
# Roles on a file; an owner owns the file, the others are granted by a share.
VIEWER, EDITOR, OWNER = "viewer", "editor", "owner"


class FileRow(Base):
    """A file or folder. `version` bumps on every change (invariant 6)."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    parent_id: Mapped[str | None] = mapped_column(String(32), ForeignKey("files.id"))
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    kind: Mapped[str] = mapped_column(String(8), nullable=False)
    owner_user_id: Mapped[str] = mapped_column(String(64), nullable=False)
    version: Mapped[int] = mapped_column(BigInteger, nullable=False, default=1)
    # Folders only: bumped whenever a child appears, changes or leaves (listing cache key).
    children_version: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    checksum: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    checksum_algorithm: Mapped[str] = mapped_column(String(16), nullable=False, default="")
    blob_key: Mapped[str | None] = mapped_column(String(255))
    # Fencing (invariant 7): the highest lock token any commit on this file carried.
    last_lock_token: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    # "{tenant}:{user}" for a root folder, else NULL: one root per user.
    root_of: Mapped[str | None] = mapped_column(String(140), unique=True)
    create_request_key: Mapped[str | None] = mapped_column(String(300), unique=True)
    deleted_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)

    __table_args__ = (Index("ix_files_tenant_parent", "tenant_id", "parent_id", "name", "id"),)


class ShareRow(Base):
    """A collaborator's role on one file."""

    __tablename__ = "shares"

    file_id: Mapped[str] = mapped_column(String(32), ForeignKey("files.id"), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(8), nullable=False)
    granted_by: Mapped[str] = mapped_column(String(64), nullable=False)
    granted_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)


class UploadRow(Base):
    """One resumable upload session."""

    __tablename__ = "uploads"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    owner_user_id: Mapped[str] = mapped_column(String(64), nullable=False)
    # "{tenant}:{user}:{client_request_id}" so a retried CreateUpload finds its upload.
    request_key: Mapped[str | None] = mapped_column(String(300), unique=True)
    client_request_id: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    # The target file; for a new file the id is reserved now and the row created at merge.
    file_id: Mapped[str] = mapped_column(String(32), nullable=False, index=True)
    is_new_file: Mapped[bool] = mapped_column(Boolean, nullable=False)
    folder_id: Mapped[str] = mapped_column(String(32), nullable=False)
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    total_chunks: Mapped[int] = mapped_column(Integer, nullable=False)
    total_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    chunk_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    checksum_algorithm: Mapped[str] = mapped_column(String(16), nullable=False)
    expected_checksum: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    # Invariant 2: equals the number of distinct stored indexes.
    received_chunk_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)
    merge_started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    merge_finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    file_version: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    final_checksum: Mapped[str] = mapped_column(String(128), nullable=False, default="")
    failure_reason: Mapped[str] = mapped_column(Text, nullable=False, default="")
    chunks_purged_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Set when the storage lifecycle deleted files/{file_id}/{id} (a superseded version past
    # retention, or a failed upload's merge output): services/upload/storage/lifecycle/.
    content_purged_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (
        Index("ix_uploads_owner", "tenant_id", "owner_user_id", "created_at"),
        Index("ix_uploads_status_expires", "status", "expires_at"),
        # The quota check's open uploads of a tenant (and of one user of it).
        Index("ix_uploads_tenant_status", "tenant_id", "status", "owner_user_id"),
    )


class ChunkRow(Base):
    """One stored chunk. Invariant 1: unique on (upload_id, chunk_index)."""

    __tablename__ = "upload_chunks"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    upload_id: Mapped[str] = mapped_column(String(32), ForeignKey("uploads.id"), nullable=False)
    chunk_index: Mapped[int] = mapped_column(Integer, nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    checksum: Mapped[str] = mapped_column(String(128), nullable=False)
    blob_key: Mapped[str] = mapped_column(String(255), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)
    # Sends of this index that reached the row: 1 for the store, +1 per duplicate or
    # conflicting retry (the chunk lifecycle logs' `attempt`).
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1", default=1)

    __table_args__ = (UniqueConstraint("upload_id", "chunk_index", name="uq_upload_chunks_index"),)


class MultipartUploadRow(Base):
    """An S3 multipart upload a merge started and has not completed or aborted yet.

    Written (committed) right after CreateMultipartUpload answers, before any part is sent,
    and deleted once the upload is completed or aborted: a merge killed in between leaves
    this row, and the re-run merge of the same key or the reclaim sweep aborts the upload
    (services/upload/storage/blob_store/multipart_journal.py).
    """

    __tablename__ = "s3_multipart_uploads"

    # S3's upload id (opaque; AWS's run to ~150 characters).
    upload_id: Mapped[str] = mapped_column(String(1024), primary_key=True)
    # The blob store's key (without the bucket prefix): files/{file_id}/{upload_id}.
    object_key: Mapped[str] = mapped_column(String(255), nullable=False, index=True)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)


class TusUploadRow(Base):
    """One tus 1.0 upload resource (services/upload/tus/): what HEAD must echo and where
    its bytes go.

    `upload_id` is the Serentak upload its bytes become chunks of (a plain upload with a
    known length, or a final concatenation); NULL while it has none (a partial upload, or
    a deferred length not yet sent), when its full pieces are parked in the blob store
    under `tus/{id}/{index}` and `pieces` counts them.
    """

    __tablename__ = "tus_uploads"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    owner_user_id: Mapped[str] = mapped_column(String(64), nullable=False)
    # No foreign key: the storage lifecycle deletes a purged upload's row (the tus row then
    # answers 404, as for an upload that never was).
    upload_id: Mapped[str | None] = mapped_column(String(32))
    # "single", "partial" or "final" (Upload-Concat).
    kind: Mapped[str] = mapped_column(String(8), nullable=False)
    # NULL: Upload-Defer-Length, not sent yet.
    length: Mapped[int | None] = mapped_column(BigInteger)
    chunk_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    pieces: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # Upload-Metadata and Upload-Concat as received (HEAD echoes them).
    upload_metadata: Mapped[str] = mapped_column(Text, nullable=False, default="")
    concat: Mapped[str] = mapped_column(Text, nullable=False, default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)
    # DELETE (termination): the URL answers 410 Gone until the row is swept at expires_at.
    terminated_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (
        Index("ix_tus_uploads_owner", "tenant_id", "owner_user_id"),
        Index("ix_tus_uploads_expires", "expires_at"),
    )


class ChangeHeadRow(Base):
    """A tenant's change log position (services/upload/files/change_log.py).

    `last_seq` is taken under this row's lock by every change, so sequence numbers commit
    in order per tenant: a reader that saw seq n has seen every seq below it.
    """

    __tablename__ = "file_change_heads"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    # Rows up to here were purged (retention): an older cursor is CURSOR_EXPIRED.
    purged_through: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)


class TenantUsageRow(Base):
    """A tenant's stored bytes: the sum of its files' current sizes, trash included.

    Kept by triggers on `files` (migration upload_0008), in the transaction of every change
    to a file's size, so the quota check reads one row (ingest/allowance.py) and no code
    path can forget to update it.
    """

    __tablename__ = "tenant_usage"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ChangeRow(Base):
    """One change of one item, for one user whose view it may change (one row per user)."""

    __tablename__ = "file_changes"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    file_id: Mapped[str] = mapped_column(String(32), nullable=False)
    event_type: Mapped[str] = mapped_column(String(32), nullable=False)
    # The row was written for an item under the folder the event named (a share, move...).
    via_folder: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    # The row's user is the one a share or unshare names (the item enters or leaves their view).
    named: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    # The item's version after the change (1 for a content update: the file was created).
    version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, nullable=False)

    __table_args__ = (Index("ix_file_changes_created", "created_at"),)
