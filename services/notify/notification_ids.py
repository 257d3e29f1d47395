"""Notification ids: 32 hex digits of a time-ordered UUID (RFC 9562 version 7).

The first 48 bits are the Unix time in milliseconds, the rest random (74 bits). New ids
sort after older ones, so a fan-out's rows land at the right edge of the primary-key
index, a handful of pages, instead of one random page each. Inserting 1,000 rows into a
table of 1,000,000 (a checkpoint every 10 inserts): 39.5 -> 28.9 ms, WAL 5.81 -> 2.05 MB,
full-page images 894 -> 284 (`tests/benchmarks/bench_notification_ids.py`, README
"Measured"). Ids drawn in the same millisecond are unordered among themselves; nothing
orders by id (streams order by `seq`).

Both fan-out paths draw them: Python (`new_notification_id`) on the per-event path, and
the batch statement itself (`NOTIFICATION_ID_SQL`, PostgreSQL 13+) from the same
millisecond clock value passed in as `:id_ms`.
"""

from __future__ import annotations

import os
import time

_VERSION = 0x7 << 76  # bits 48-51 of the 128: the version nibble
_VARIANT = 0x2 << 62  # bits 64-65: the RFC 9562 variant (10)
_RANDOM = ((1 << 80) - 1) & ~(0xF << 76) & ~(0x3 << 62)


def now_ms() -> int:
    """The clock value ids carry: Unix time in milliseconds."""
    return time.time_ns() // 1_000_000


def new_notification_id(ms: int | None = None) -> str:
    """A new id: 32 lowercase hex digits, ordered by the millisecond it was drawn in."""
    stamp = (now_ms() if ms is None else ms) & ((1 << 48) - 1)
    random = int.from_bytes(os.urandom(10), "big") & _RANDOM
    return f"{stamp << 80 | _VERSION | _VARIANT | random:032x}"


# The same form in SQL: a random (version 4) UUID whose first 6 bytes become `:id_ms` and
# whose version nibble goes 4 -> 7 (bits 52 and 53 of the bytea, counted from byte 0's
# least significant bit); its variant bits are already RFC 9562's.
NOTIFICATION_ID_SQL = (
    "encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) "
    "placing substring(int8send(CAST(:id_ms AS bigint)) FROM 3) FROM 1 FOR 6), "
    "52, 1), 53, 1), 'hex')"
)
