"""Notification ids are time-ordered UUIDs (RFC 9562 version 7) on both fan-out paths:
the per-event path (Python) and PostgreSQL's one-statement batch draw the same form,
carrying the millisecond they were drawn in, so new rows append to the primary-key
index instead of landing on a random page each."""

from __future__ import annotations

import time
import uuid

from notify.harness import event

from services.notify import metrics
from services.notify.notification_ids import new_notification_id


def _ms(notification_id: str) -> int:
    return int(notification_id[:12], 16)


def _is_v7(notification_id: str) -> bool:
    u = uuid.UUID(hex=notification_id)
    return (
        len(notification_id) == 32
        and notification_id == u.hex
        and u.version == 7
        and u.variant == uuid.RFC_4122
    )


def test_an_id_is_a_version_7_uuid_carrying_its_millisecond() -> None:
    ms = 1_780_000_000_123
    nid = new_notification_id(ms)
    assert _is_v7(nid)
    assert _ms(nid) == ms


def test_ids_of_a_later_millisecond_sort_after_and_none_repeats() -> None:
    by_ms = {ms: [new_notification_id(ms) for _ in range(200)] for ms in range(5_000, 5_050)}
    every = [nid for ids in by_ms.values() for nid in ids]
    assert len(set(every)) == len(every)
    for ms in range(5_000, 5_049):
        assert max(by_ms[ms]) < min(by_ms[ms + 1])


async def test_both_fan_out_paths_store_version_7_ids_of_their_millisecond(notify, database_url):
    inline_before = metrics.FANOUT_INLINE_EVENTS._value.get()
    drawn: dict[int, tuple[int, int]] = {}  # version -> the clock around its fan-out
    # Content updates take PostgreSQL's batch statement; a rename may fold into a
    # digest, so it takes the per-event path (SQLite takes it for every event).
    for version, kind in enumerate(("content", "rename", "content", "rename"), start=1):
        before = time.time_ns() // 1_000_000
        resp = await notify.ingest_settled(event("f-ids", version, kind=kind, name=f"r{version}"))
        assert resp.notifications_written == 2  # alice and bob; carol acts
        drawn[version] = (before, time.time_ns() // 1_000_000)
    if database_url.startswith("postgresql"):
        assert metrics.FANOUT_INLINE_EVENTS._value.get() - inline_before == 2
    for user in ("alice", "bob"):
        got = await notify.all_notifications(user)
        assert sorted(n.version for n in got) == [1, 2, 3, 4]
        for n in got:
            assert _is_v7(n.notification_id), n.notification_id
            low, high = drawn[n.version]
            assert low <= _ms(n.notification_id) <= high
    ids = [n.notification_id for u in ("alice", "bob") for n in await notify.all_notifications(u)]
    assert len(set(ids)) == len(ids) == 8
