"""Times bound for SQLite are the text SQLAlchemy's own DATETIME processing writes (naive
UTC, microseconds always), so every stored time still sorts and compares as text; naive
times are refused."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import DateTime
from sqlalchemy.dialects import sqlite

from services.common.jobs.models import UtcDateTime as CommonUtcDateTime
from services.upload.models import UtcDateTime as UploadUtcDateTime

DIALECT = sqlite.dialect()


def sqlalchemys_text(value: datetime) -> str:
    """What SQLAlchemy's SQLite DATETIME writes for the same instant, naive UTC."""
    bind = DateTime().dialect_impl(DIALECT).bind_processor(DIALECT)
    return str(bind(value.astimezone(UTC).replace(tzinfo=None)))


def instants() -> list[datetime]:
    rng = random.Random(7)
    fixed = [
        datetime(2026, 12, 7, 9, 40, 1, tzinfo=UTC),  # no microseconds
        datetime(2026, 12, 7, 9, 40, 1, 1, tzinfo=UTC),
        datetime(1, 1, 2, tzinfo=UTC),
        datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 12, 7, 2, 0, tzinfo=timezone(timedelta(hours=7))),  # the day before
    ]
    drawn = [
        datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(2**52))
        for _ in range(500)
    ]
    return fixed + drawn


@pytest.mark.parametrize("column", [CommonUtcDateTime, UploadUtcDateTime])
def test_sqlite_text_is_sqlalchemys(column: type) -> None:
    bind = column().dialect_impl(DIALECT).bind_processor(DIALECT)
    for value in instants():
        assert bind(value) == sqlalchemys_text(value), value
    assert bind(None) is None
    with pytest.raises(ValueError, match="naive"):
        bind(datetime(2026, 12, 7))
