"""Digest: a burst sharing a dedupe_key inside the window becomes one notification with
the latest state; outside the window, or for content changes, every version stays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from notify.harness import event, user_md
from serentak.notify.v1 import notify_pb2

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def renames(file_id: str, names: list[str], spacing: timedelta) -> list:
    return [
        event(file_id, v, kind="rename", name=name, occurred_at=T0 + spacing * (v - 1))
        for v, name in enumerate(names, start=1)
    ]


async def test_three_renames_inside_the_window_become_one_with_the_latest_name(notify):
    for ev in renames("f-dig", ["a.txt", "b.txt", "c.txt"], timedelta(milliseconds=500)):
        await notify.ingest_settled(ev)
    for user in ("alice", "bob"):
        got = await notify.all_notifications(user)
        assert len(got) == 1
        (only,) = got
        assert (only.file_name, only.version, only.digest_count) == ("c.txt", 3, 3)
        assert only.summary == "carol renamed a file to c.txt"
        assert await notify.unread(user) == 1


async def test_three_renames_outside_the_window_stay_three(notify):
    for ev in renames("f-slow", ["a.txt", "b.txt", "c.txt"], timedelta(seconds=3)):
        await notify.ingest_settled(ev)
    got = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
    assert [(n.file_name, n.digest_count) for n in got] == [
        ("a.txt", 1),
        ("b.txt", 1),
        ("c.txt", 1),
    ]


async def test_window_is_configurable(notify_factory):
    async with notify_factory(digest_window_seconds=10) as notify:
        for ev in renames("f-wide", ["a", "b", "c"], timedelta(seconds=3)):
            await notify.ingest_settled(ev)
        assert [n.file_name for n in await notify.all_notifications("alice")] == ["c"]


async def test_content_changes_are_never_merged(notify):
    for v in (1, 2, 3):
        await notify.ingest_settled(
            event("f-content", v, name="r.pdf", occurred_at=T0 + timedelta(milliseconds=10 * v))
        )
    got = await notify.all_notifications("alice")
    assert sorted(n.version for n in got) == [1, 2, 3]


async def test_a_read_or_interrupted_burst_starts_a_new_notification(notify):
    a, b, c, d = renames("f-int", ["a", "b", "c", "d"], timedelta(milliseconds=100))
    await notify.ingest_settled(a)
    (first,) = await notify.all_notifications("alice")
    await notify.stub.MarkRead(
        notify_pb2.MarkReadRequest(notification_ids=[first.notification_id]),
        metadata=user_md("alice"),
    )
    await notify.ingest_settled(b)  # alice read "a": news gets its own notification
    content = event("f-int", 3, name="d", occurred_at=T0 + timedelta(milliseconds=150))
    c.version, d.version = 4, 5
    await notify.ingest_settled(content)
    await notify.ingest_settled(c)  # a content change came in between: no fold across it
    await notify.ingest_settled(d)  # folds into "c"
    alice = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
    assert [(n.event_type, n.file_name, n.version) for n in alice] == [
        ("file.renamed", "a", 1),
        ("file.renamed", "b", 2),
        ("file.content.updated", "d", 3),
        ("file.renamed", "d", 5),
    ]
    bob = sorted(await notify.all_notifications("bob"), key=lambda n: int(n.cursor))
    assert [(n.file_name, n.version, n.digest_count) for n in bob] == [
        ("b", 2, 2),
        ("d", 3, 1),
        ("d", 5, 2),
    ]
