"""Pure decisions: what an upstream answer means for an item, a delta cursor, a retry.

No I/O here, so every branch of invariant 14 is unit-tested without sockets:

| upstream answer on an item | action                                                |
| -------------------------- | ----------------------------------------------------- |
| 2xx                        | SYNCED, retry count 0 (tombstone if removed/expired)  |
| 410 Gone                   | TOMBSTONE now; terminal, never re-queued              |
| 404 Not Found              | PENDING_RETRY with backoff, dead-letter past the bound |
| 429 / 503                  | retry no sooner than Retry-After                       |
| other 5xx, 408, timeouts   | transient retry                                        |
| 401 / 403                  | permanent: dead-letter, count for alerting            |
| anything else (4xx)        | permanent                                             |

On a delta cursor a 410 means only "cursor expired": re-enumerate, tombstone nothing.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


class ItemAction(enum.Enum):
    """What the item sync job does with an upstream answer."""

    MARK_SYNCED = "mark_synced"
    TOMBSTONE = "tombstone"
    RETRY_NOT_FOUND = "retry_not_found"
    GIVE_UP_NOT_FOUND = "give_up_not_found"
    RETRY_AFTER = "retry_after"
    RETRY_TRANSIENT = "retry_transient"
    FAIL_AUTH = "fail_auth"
    FAIL_PERMANENT = "fail_permanent"


class DeltaAction(enum.Enum):
    """What the delta poll does with an error on its cursor."""

    FULL_RESYNC = "full_resync"
    RETRY_AFTER = "retry_after"
    RETRY_TRANSIENT = "retry_transient"
    FAIL_AUTH = "fail_auth"
    FAIL_PERMANENT = "fail_permanent"


@dataclass(frozen=True, slots=True)
class ItemDecision:
    """The action for one item answer; `retry_count` is the item's count after it."""

    action: ItemAction
    retry_count: int = 0
    retry_after: float | None = None


# Statuses whose Retry-After we honour; other codes may send it but mean something else.
_THROTTLED = frozenset({429, 503})
_AUTH = frozenset({401, 403})


def _is_transient(status: int) -> bool:
    # 0: no HTTP answer at all (timeout, connection reset).
    return status == 0 or status == 408 or status >= 500


def decide_item(
    status: int, *, retry_count: int, max_not_found_retries: int, retry_after: float | None = None
) -> ItemDecision:
    """Map an HTTP status for an item GET to an action.

    `retry_count` is the number of consecutive 404s recorded so far; a 404 that would
    exceed `max_not_found_retries` gives up (dead-letter).
    """
    if 200 <= status < 300:
        return ItemDecision(ItemAction.MARK_SYNCED, retry_count=0)
    if status == 410:
        return ItemDecision(ItemAction.TOMBSTONE, retry_count=retry_count)
    if status == 404:
        if retry_count >= max_not_found_retries:
            return ItemDecision(ItemAction.GIVE_UP_NOT_FOUND, retry_count=retry_count + 1)
        return ItemDecision(ItemAction.RETRY_NOT_FOUND, retry_count=retry_count + 1)
    if status in _THROTTLED:
        return ItemDecision(ItemAction.RETRY_AFTER, retry_count, retry_after=retry_after)
    if _is_transient(status):
        return ItemDecision(ItemAction.RETRY_TRANSIENT, retry_count)
    if status in _AUTH:
        return ItemDecision(ItemAction.FAIL_AUTH, retry_count)
    return ItemDecision(ItemAction.FAIL_PERMANENT, retry_count)


def decide_delta(status: int) -> DeltaAction:
    """Map an HTTP status on a delta cursor to an action (410: the cursor expired)."""
    if status == 410:
        return DeltaAction.FULL_RESYNC
    if status in _THROTTLED:
        return DeltaAction.RETRY_AFTER
    # A drive that 404s may be a replication lag; the job runtime bounds the retries.
    if _is_transient(status) or status == 404:
        return DeltaAction.RETRY_TRANSIENT
    if status in _AUTH:
        return DeltaAction.FAIL_AUTH
    return DeltaAction.FAIL_PERMANENT


def is_expired(expires_at: datetime | None, now: datetime) -> bool:
    """True when the provider's retention end has passed (no network call needed)."""
    return expires_at is not None and expires_at <= now


def not_found_delay(
    retry_count: int, *, base_seconds: float, cap_seconds: float, rng: random.Random | None = None
) -> float:
    """Seconds before 404 retry number `retry_count` (1-based): full jitter,

    ``uniform(0, min(cap, base * 2 ** (retry_count - 1)))``.
    """
    ceiling = min(cap_seconds, base_seconds * 2 ** min(max(retry_count - 1, 0), 62))
    return (rng or random).uniform(0, ceiling)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date); None if absent/bad."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
