"""Time as the notify tables store it: naive UTC (identical on SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """Now, naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


def to_naive_utc(moment: datetime) -> datetime:
    """`moment` as naive UTC (aware values are converted, naive ones taken as UTC)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment
