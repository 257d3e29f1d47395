"""Notification rows as `serentak.notify.v1.Notification` messages."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from serentak.notify.v1 import notify_pb2

from services.notify import cursors


def _timestamp(moment: datetime | None) -> Timestamp | None:
    if moment is None:
        return None
    return _timestamp_of(moment)


@functools.lru_cache(maxsize=1024)
def _timestamp_of(moment: datetime) -> Timestamp:
    # A fan-out stamps all its rows with the same instants: convert each once. Callers
    # only pass the result to message constructors, which copy it (never mutate it).
    ts = Timestamp()
    ts.FromDatetime(moment.replace(tzinfo=UTC))
    return ts


def to_message(row: Any) -> notify_pb2.Notification:
    """Build the message from a `Notification` row (or anything with its attributes)."""
    return notify_pb2.Notification(
        notification_id=row.notification_id,
        cursor=cursors.encode(row.seq),
        user_id=row.user_id,
        tenant_id=row.tenant_id,
        file_id=row.file_id,
        version=row.version,
        event_type=row.event_type,
        event_id=row.event_id,
        actor_user_id=row.actor_user_id,
        file_name=row.file_name,
        summary=row.summary,
        dedupe_key=row.dedupe_key,
        digest_count=row.digest_count,
        read=row.read_at is not None,
        created_at=_timestamp(row.created_at),
        updated_at=_timestamp(row.updated_at),
        read_at=_timestamp(row.read_at),
        correlation_id=row.correlation_id,
    )


def row_message(row: dict[str, Any]) -> notify_pb2.Notification:
    """Build the message from a row as a dict of `Notification` column values."""
    read_at = row.get("read_at")
    return notify_pb2.Notification(
        notification_id=row["notification_id"],
        cursor=cursors.encode(row["seq"]),
        user_id=row["user_id"],
        tenant_id=row["tenant_id"],
        file_id=row["file_id"],
        version=row["version"],
        event_type=row["event_type"],
        event_id=row["event_id"],
        actor_user_id=row["actor_user_id"],
        file_name=row["file_name"],
        summary=row["summary"],
        dedupe_key=row["dedupe_key"],
        digest_count=row["digest_count"],
        read=read_at is not None,
        created_at=_timestamp(row["created_at"]),
        updated_at=_timestamp(row["updated_at"]),
        read_at=_timestamp(read_at),
        correlation_id=row["correlation_id"],
    )
