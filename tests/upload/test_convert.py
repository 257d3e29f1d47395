"""Times in answers are the same instants as protobuf's own conversion gives, to the
microsecond, before and after 1970, given aware or naive (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from google.protobuf import timestamp_pb2

from services.upload.convert import timestamp


def protobufs(value: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def test_times_convert_as_protobuf_converts_them() -> None:
    for value in (
        datetime(2026, 12, 7, 9, 40, 1, 123456, tzinfo=UTC),
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1900, 5, 6, 7, 8, 9, 1, tzinfo=UTC),
        datetime(2026, 12, 7, 9, 40, 1, 5, tzinfo=timezone(timedelta(hours=7))),
        datetime(2026, 12, 7, 9, 40, 1, 999999),  # naive: UTC
    ):
        assert timestamp(value) == protobufs(value), value


def test_a_missing_time_is_none() -> None:
    assert timestamp(None) is None
