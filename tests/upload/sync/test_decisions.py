"""Unit tests of the pure status decisions (no sockets)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from services.upload.sync.decisions import (
    DeltaAction,
    ItemAction,
    decide_delta,
    decide_item,
    is_expired,
    not_found_delay,
    parse_retry_after,
)


def _item(status: int, retry_count: int = 0, retry_after: float | None = None) -> ItemAction:
    return decide_item(
        status, retry_count=retry_count, max_not_found_retries=5, retry_after=retry_after
    ).action


@pytest.mark.parametrize(
    ("status", "action"),
    [
        (200, ItemAction.MARK_SYNCED),
        (410, ItemAction.TOMBSTONE),
        (404, ItemAction.RETRY_NOT_FOUND),
        (429, ItemAction.RETRY_AFTER),
        (503, ItemAction.RETRY_AFTER),
        (500, ItemAction.RETRY_TRANSIENT),
        (502, ItemAction.RETRY_TRANSIENT),
        (0, ItemAction.RETRY_TRANSIENT),
        (408, ItemAction.RETRY_TRANSIENT),
        (401, ItemAction.FAIL_AUTH),
        (403, ItemAction.FAIL_AUTH),
        (400, ItemAction.FAIL_PERMANENT),
    ],
)
def test_item_status_table(status: int, action: ItemAction) -> None:
    assert _item(status) is action


def test_404_counts_up_and_gives_up_past_the_bound() -> None:
    counts = []
    count = 0
    while True:
        d = decide_item(404, retry_count=count, max_not_found_retries=5)
        if d.action is ItemAction.GIVE_UP_NOT_FOUND:
            break
        counts.append(d.retry_count)
        count = d.retry_count
    assert counts == [1, 2, 3, 4, 5]


def test_200_resets_the_count_and_410_is_terminal_whatever_the_count() -> None:
    assert decide_item(200, retry_count=4, max_not_found_retries=5).retry_count == 0
    assert _item(410, retry_count=99) is ItemAction.TOMBSTONE


def test_retry_after_travels_with_the_decision() -> None:
    d = decide_item(429, retry_count=0, max_not_found_retries=5, retry_after=2.0)
    assert d.retry_after == 2.0


@pytest.mark.parametrize(
    ("status", "action"),
    [
        (410, DeltaAction.FULL_RESYNC),
        (429, DeltaAction.RETRY_AFTER),
        (503, DeltaAction.RETRY_AFTER),
        (500, DeltaAction.RETRY_TRANSIENT),
        (404, DeltaAction.RETRY_TRANSIENT),
        (401, DeltaAction.FAIL_AUTH),
        (400, DeltaAction.FAIL_PERMANENT),
    ],
)
def test_delta_status_table(status: int, action: DeltaAction) -> None:
    assert decide_delta(status) is action


def test_expiry_is_inclusive_and_none_never_expires() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert is_expired(now, now)
    assert is_expired(now - timedelta(seconds=1), now)
    assert not is_expired(now + timedelta(seconds=1), now)
    assert not is_expired(None, now)


def test_not_found_delay_is_jittered_under_a_doubling_capped_ceiling() -> None:
    rng = random.Random(7)
    for n in range(1, 12):
        ceiling = min(10.0, 0.5 * 2 ** (n - 1))
        samples = [
            not_found_delay(n, base_seconds=0.5, cap_seconds=10.0, rng=rng) for _ in range(200)
        ]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling / 2  # jitter spreads over the range


def test_parse_retry_after_seconds_and_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
