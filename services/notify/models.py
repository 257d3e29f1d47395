"""Tables of the notify service (SQLAlchemy 2 declarative).

Timestamps are naive UTC (`clock.utcnow()`), the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from services.common.db import new_metadata

metadata = new_metadata()

ID_LEN = 128


def opaque_id(length: int = ID_LEN) -> TypeEngine[str]:
    """An identifier column compared byte by byte: COLLATE "C" on PostgreSQL (migration
    notify_0006: cheaper B-tree comparisons, and the order Python's `sorted()` gives),
    SQLite's default BINARY elsewhere."""
    return String(length).with_variant(String(length, collation="C"), "postgresql")


class Base(DeclarativeBase):
    """Declarative base bound to the service's metadata."""

    metadata = metadata


class InboxStatus:
    """Values of `InboxEvent.status`."""

    PARKED = "parked"  # ahead of the next expected version: waits for its predecessors
    APPLIED = "applied"  # its turn came: accepted in version order, fan-out job queued
    NOTIFIED = "notified"  # the fan-out job wrote its notifications
    SKIPPED_OLD = "skipped_old"


class InboxEvent(Base):
    """One ingested event, unique by `event_id`: a redelivery finds its row and stops."""

    __tablename__ = "notify_inbox"

    event_id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    aggregate_id: Mapped[str] = mapped_column(String(ID_LEN))
    version: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    # The serialized `serentak.events.v1.Event`, so a parked event can be applied later.
    event: Mapped[bytes] = mapped_column(LargeBinary)
    correlation_id: Mapped[str] = mapped_column(String(ID_LEN), default="")
    received_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)

    __table_args__ = (
        # Draining parked successors: WHERE aggregate_id = ? AND status = 'parked' AND version = ?
        Index("ix_notify_inbox_aggregate_status_version", "aggregate_id", "status", "version"),
        Index("ix_notify_inbox_finished_at", "finished_at"),
    )


class AggregateVersion(Base):
    """The last version applied per aggregate (file or folder): invariant 10's `current`.

    Its row is also the per-aggregate lock: applying an event holds it FOR UPDATE. The
    aggregate's terminal event (`file.purged`) retires it: every later event is old, and
    the retention job deletes the row once no redelivery can arrive (`retirement.py`).
    """

    __tablename__ = "notify_aggregate_versions"

    aggregate_id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    applied_version: Mapped[int] = mapped_column(BigInteger, default=0)
    retired_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)

    __table_args__ = (
        # Retention: retired rows only (a live aggregate has no entry to write).
        Index(
            "ix_notify_aggregate_versions_retired_at",
            "retired_at",
            postgresql_where=text("retired_at IS NOT NULL"),
            sqlite_where=text("retired_at IS NOT NULL"),
        ),
    )


class UserStream(Base):
    """Per-user stream position. Bumping `last_seq` row-locks it, so one user's notification
    writes commit one at a time and in `seq` order: a cursor never skips a late commit."""

    __tablename__ = "notify_user_streams"
    # Room on each page for HOT updates of last_seq (migration notify_0007).
    __table_args__ = {"postgresql_with": {"fillfactor": 70}}

    tenant_id: Mapped[str] = mapped_column(opaque_id(), primary_key=True)
    user_id: Mapped[str] = mapped_column(opaque_id(), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)


class Notification(Base):
    """What one user is told about one aggregate version (or a digest of a burst)."""

    __tablename__ = "notifications"

    notification_id: Mapped[str] = mapped_column(opaque_id(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(opaque_id())
    user_id: Mapped[str] = mapped_column(opaque_id())
    # Position in the user's stream; a digest update takes a new, higher one.
    seq: Mapped[int] = mapped_column(BigInteger)
    file_id: Mapped[str] = mapped_column(opaque_id())
    # The latest version this notification stands for.
    version: Mapped[int] = mapped_column(BigInteger)
    event_type: Mapped[str] = mapped_column(String(64))
    event_id: Mapped[str] = mapped_column(String(ID_LEN))
    actor_user_id: Mapped[str] = mapped_column(String(ID_LEN), default="")
    file_name: Mapped[str] = mapped_column(String(1024), default="")
    summary: Mapped[str] = mapped_column(String(2048), default="")
    dedupe_key: Mapped[str] = mapped_column(String(256), default="")
    digest_count: Mapped[int] = mapped_column(Integer, default=1)
    # occurred_at of the first event of the burst: the digest window is measured from it.
    window_started_at: Mapped[datetime] = mapped_column(DateTime)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    read_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    correlation_id: Mapped[str] = mapped_column(String(ID_LEN), default="")

    __table_args__ = (
        # Invariant 12: at most one notification per (user, file, version).
        UniqueConstraint(
            "tenant_id", "user_id", "file_id", "version", name="uq_notifications_user_file_version"
        ),
        UniqueConstraint("tenant_id", "user_id", "seq", name="uq_notifications_user_seq"),
        # Badge: COUNT(*) WHERE tenant_id, user_id AND read_at IS NULL.
        Index("ix_notifications_user_read", "tenant_id", "user_id", "read_at"),
        # Retention: read rows only (a new notification is unread: no entry to write).
        # The digest candidate (a user's latest notification for a file) is the highest
        # version on uq_notifications_user_file_version (migration notify_0004).
        Index(
            "ix_notifications_read_at",
            "read_at",
            postgresql_where=text("read_at IS NOT NULL"),
            sqlite_where=text("read_at IS NOT NULL"),
        ),
    )
