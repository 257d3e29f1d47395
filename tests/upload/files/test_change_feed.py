"""ListChanges: a snapshot of the caller's view, then every change to it (own ones too),
with items entering and leaving the view, expired and forged cursors, and the long poll."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from upload.change_helpers import FeedCopy, view
from upload.tree_helpers import folder, move, share, upload
from upload.upload_helpers import expect_error

from services.upload.files.change_log import purge_changes

K = upload_pb2


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    """Waiting calls re-read the log once a minute (only the in-process wake-up is fast);
    at most two wait at once."""
    return {"change_wait_recheck_ms": 60_000, "change_wait_max_waiters": 2}


async def _rename(client, file_id: str, name: str) -> None:
    await client.files.RenameFile(
        upload_pb2.RenameFileRequest(file_id=file_id, new_name=name), metadata=client.metadata
    )


async def _unshare(client, file_id: str, user_id: str) -> None:
    await client.files.UnshareFile(
        upload_pb2.UnshareFileRequest(file_id=file_id, user_id=user_id), metadata=client.metadata
    )


async def test_snapshot_then_changes_reproduce_the_listings(cluster) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    docs = await folder(alice, "docs")
    inner = await folder(alice, "inner", docs)
    report = await upload(alice, b"report", "report.txt", inner)
    await upload(alice, b"private", "private.txt")
    await share(alice, docs, "bob", upload_pb2.ROLE_VIEWER)
    await folder(bob, "mine")

    feeds = {name: FeedCopy(cluster[name]) for name in ("alice", "bob", "carol")}
    for name, feed in feeds.items():
        pages = await feed.catch_up(page_size=2)
        assert pages[0].reset and not any(p.reset for p in pages[1:])
        assert all(c.kind == K.CHANGE_KIND_LISTED for p in pages for c in p.changes)
        assert feed.items() == await view(cluster[name]), name
    assert set(feeds["bob"].items()) >= {docs, inner, report}
    assert feeds["carol"].items() == {}

    # Alice's own changes reach alice's feed too (her other devices need them).
    await _rename(alice, report, "final.txt")
    got = await feeds["alice"].page()
    assert [(c.kind, c.file_id, c.file.name) for c in got.changes] == [
        (K.CHANGE_KIND_RENAMED, report, "final.txt")
    ]
    await upload(alice, b"new", "new.txt", inner)
    await feeds["bob"].catch_up()
    assert feeds["bob"].received[-1][0] == K.CHANGE_KIND_CREATED

    # Unsharing the folder takes it and everything under it out of bob's view.
    await _unshare(alice, docs, "bob")
    pages = await feeds["bob"].catch_up()
    left = {c.file_id: c.kind for p in pages for c in p.changes}
    assert left[docs] == K.CHANGE_KIND_LEFT_VIEW and left[report] == K.CHANGE_KIND_LEFT_VIEW
    assert feeds["bob"].items() == await view(bob)
    assert report not in feeds["bob"].items()

    # Moving a folder into one shared with carol brings it (and all under it) into her view;
    # moving it out again takes it away.
    shared_with_carol = await folder(alice, "for-carol")
    await share(alice, shared_with_carol, "carol", upload_pb2.ROLE_EDITOR)
    await move(alice, inner, shared_with_carol)
    pages = await feeds["carol"].catch_up()
    entered = {c.file_id: c.kind for p in pages for c in p.changes}
    assert entered[shared_with_carol] == K.CHANGE_KIND_ENTERED_VIEW
    assert entered[report] == K.CHANGE_KIND_ENTERED_VIEW
    assert report in feeds["carol"].items()
    await move(alice, inner, docs)
    await feeds["carol"].catch_up()
    assert report not in feeds["carol"].items()

    # Delete and restore.
    await alice.files.DeleteFile(
        upload_pb2.DeleteFileRequest(file_id=docs), metadata=alice.metadata
    )
    pages = await feeds["alice"].catch_up()
    assert (K.CHANGE_KIND_DELETED, docs, True) in feeds["alice"].received
    assert report not in feeds["alice"].items()
    await alice.files.RestoreFile(
        upload_pb2.RestoreFileRequest(file_id=docs), metadata=alice.metadata
    )
    await feeds["alice"].catch_up()
    assert (K.CHANGE_KIND_RESTORED, docs, False) in feeds["alice"].received
    for name, feed in feeds.items():
        await feed.catch_up()
        assert feed.items() == await view(cluster[name]), name
    # Nothing new: an empty page keeps the position.
    quiet = await feeds["bob"].page()
    assert not quiet.changes and not quiet.has_more and quiet.next_cursor


async def test_forged_foreign_and_expired_cursors_are_precise(cluster, sessions) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    await folder(alice, "a")
    feed = FeedCopy(alice)
    await feed.catch_up()
    forged = feed.cursor[:-2] + ("AA" if not feed.cursor.endswith("AA") else "BB")
    for cursor, who in ((forged, alice), (feed.cursor, bob), ("garbage", alice)):
        await expect_error(
            who.files.ListChanges(
                upload_pb2.ListChangesRequest(cursor=cursor), metadata=who.metadata
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "CURSOR_INVALID",
        )
    await expect_error(
        alice.files.ListChanges(
            upload_pb2.ListChangesRequest(page_size=5000), metadata=alice.metadata
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    await folder(alice, "b")
    assert await purge_changes(sessions, timedelta(0)) >= 1
    await expect_error(
        alice.files.ListChanges(
            upload_pb2.ListChangesRequest(cursor=feed.cursor), metadata=alice.metadata
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "CURSOR_EXPIRED",
    )
    # Enumerating again converges.
    fresh = FeedCopy(alice)
    await fresh.catch_up()
    assert fresh.items() == await view(alice)


async def _until_waiting(count: int) -> None:
    """Return once `count` ListChanges calls wait on the (in-process) server."""
    for _ in range(1000):  # at most 10 s
        if (REGISTRY.get_sample_value("serentak_upload_change_waiters") or 0) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} ListChanges calls never waited at once")


async def test_a_waiting_call_wakes_on_a_commit(cluster) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    docs = await folder(alice, "docs")
    await share(alice, docs, "bob", upload_pb2.ROLE_VIEWER)
    feed = FeedCopy(bob)
    await feed.catch_up()
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.create_task(feed.page(wait_ms=30_000))
    # The rename commits while the call waits (its re-read every minute cannot answer it).
    await _until_waiting(1)
    # Up to the limit calls wait; the next one that would wait is refused at once.
    other = FeedCopy(bob, feed.cursor)
    second = asyncio.create_task(other.page(wait_ms=30_000))
    await _until_waiting(2)
    await expect_error(
        bob.files.ListChanges(
            upload_pb2.ListChangesRequest(cursor=feed.cursor, wait_ms=1000), metadata=bob.metadata
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "CHANGE_WAITER_LIMIT",
    )
    await _rename(alice, docs, "renamed")
    assert [c.file_id for c in (await second).changes] == [docs]
    got = await waiting
    assert [(c.kind, c.file.name) for c in got.changes] == [(K.CHANGE_KIND_RENAMED, "renamed")]
    assert loop.time() - started < 10
    # With nothing to wait for, a short wait answers empty at its end.
    empty = await feed.page(wait_ms=50)
    assert not empty.changes


async def test_an_offline_client_catches_up_in_bounded_pages(cluster) -> None:
    """600 changes while a client is away: it catches up in pages of at most page_size
    changes (its memory bound: one page), each change once, to exactly the listings."""
    alice, bob = cluster["alice"], cluster["bob"]
    docs = await folder(alice, "docs")
    await share(alice, docs, "bob", upload_pb2.ROLE_EDITOR)
    names = [await folder(alice, f"f{i}", docs) for i in range(6)]
    feed = FeedCopy(bob)
    await feed.catch_up()
    before = len(feed.received)

    async def churn(file_id: str) -> None:
        for n in range(100):
            await _rename(alice if n % 2 else bob, file_id, f"{file_id[:6]}-{n}")

    await asyncio.gather(*(churn(f) for f in names))
    pages = await feed.catch_up(page_size=250)
    assert [len(p.changes) for p in pages] == [250, 250, 100]
    assert [p.has_more for p in pages] == [True, True, False]
    assert len(feed.received) - before == 600
    assert all(kind == K.CHANGE_KIND_RENAMED for kind, _, _ in feed.received[before:])
    assert feed.items() == await view(bob)
