"""The SDK's SerentakClient against real services (upload, locks on etcd, notify): upload
with resume and progress, verified atomic download, a held lock (and its loss, which
cancels the block), a subscription resumed from its cursor. Both databases."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import grpc
import pytest
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.sdk import ChecksumMismatch, LockHeld, LockLost, notifications_in
from serentak.upload.v1 import upload_pb2

from services.locks.etcd_client import Etcd
from services.upload.storage.blob_store import content_key, open_blob_store

CHUNK = 1024
DEADLINE_S = 60.0


class Crash(Exception):
    """Stands for the process dying part-way through sending chunks."""


async def test_upload_resumes_and_download_is_verified(stack, tmp_path: Path) -> None:
    source = tmp_path / "data.bin"
    data = os.urandom(10 * CHUNK + 5)
    source.write_bytes(data)
    async with stack.client("dev-alice") as alice:
        upload = await alice.create_upload(source, chunk_size=CHUNK)
        sent: list[int] = []

        def crash_after_four(done: int, total: int) -> None:
            sent.append(done)
            if len(sent) > 4:
                raise Crash

        with pytest.raises(Crash):
            await alice.send_missing(upload, source, parallel=1, progress=crash_after_four)
        assert (await alice.get_upload(upload.upload_id)).received_chunk_count == 4
        # Again from scratch (a new process): the request id finds the same upload, and
        # only the missing chunks are sent; progress starts at what the server holds.
        seen: list[tuple[int, int]] = []
        created: list[str] = []
        done = await alice.upload(
            source,
            chunk_size=CHUNK,
            progress=lambda d, t: seen.append((d, t)),
            on_created=lambda u: created.append(u.upload_id),
        )
        assert created == [upload.upload_id] and done.upload_id == upload.upload_id
        assert seen[0] == (4 * CHUNK, len(data)) and seen[-1] == (len(data), len(data))
        assert len(seen) == 1 + 7  # the starting point, then 7 missing chunks
        assert [u.upload_id for u in await alice.list_uploads()] == [upload.upload_id]

        target = tmp_path / "out" / "copy.bin"
        target.parent.mkdir()
        progress: list[int] = []
        result = await alice.download(
            done.file_id, target, progress=lambda d, t: progress.append(d)
        )
        assert result.verified and target.read_bytes() == data and progress[-1] == len(data)

        # A corrupted blob: the checksum does not match, and nothing is left behind.
        blobs = open_blob_store(stack.settings)
        key = content_key(done.file_id, done.upload_id)
        raw = await blobs.read(key)
        await blobs.publish(await blobs.stage(key, bytes([raw[0] ^ 1]) + raw[1:]), key)
        await blobs.close()
        with pytest.raises(ChecksumMismatch):
            await alice.download(done.file_id, target.parent / "bad.bin")
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await alice.download("nosuchfile", target.parent / "none.bin")
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(FileNotFoundError):
            await alice.download(done.file_id, tmp_path / "no-dir" / "x.bin")
        assert sorted(p.name for p in target.parent.iterdir()) == ["copy.bin"]


async def test_hold_keeps_the_lock_and_subscribe_resumes_from_a_cursor(stack, tmp_path):
    async with stack.client("dev-alice") as alice, stack.client("dev-bob") as bob:
        key = "user:alice:sdk"
        async with alice.hold(key, ttl_seconds=2) as lock:
            # Past the TTL the lease is still alive: the Hold stream renews it.
            await asyncio.sleep(3)
            held = await alice.describe_lock(key)
            assert held.held and held.lock.token == lock.token
            with pytest.raises(LockHeld) as busy:
                async with alice.hold(key, owner="other"):
                    pass
            assert busy.value.code == grpc.StatusCode.ABORTED
        assert not (await alice.describe_lock(key)).held

        stream = bob.subscribe()
        marker = await anext(stream)  # "now": the cursor to resume from
        assert not marker.notification.notification_id and marker.cursor
        source = tmp_path / "shared.bin"
        source.write_bytes(b"for bob")
        done = await alice.upload(source, chunk_size=CHUNK)
        await alice.share(done.file_id, "bob", upload_pb2.ROLE_EDITOR)
        first = await asyncio.wait_for(anext(stream), DEADLINE_S)
        assert first.notification.file_id == done.file_id
        await stream.aclose()

        # From the marker: the same first notification again; from its cursor: what follows.
        again = bob.subscribe(marker.cursor)
        replay = await asyncio.wait_for(anext(again), DEADLINE_S)
        assert replay.notification.notification_id == first.notification.notification_id
        await again.aclose()
        source.write_bytes(b"for bob, version 2")
        await alice.upload(source, to_file_id=done.file_id, chunk_size=CHUNK)
        after = bob.subscribe(first.cursor)
        async with contextlib.aclosing(after):
            following: notify_pb2.SubscribeResponse = await asyncio.wait_for(
                anext(after), DEADLINE_S
            )
        assert following.notification.notification_id != first.notification.notification_id
        assert following.notification.file_id == done.file_id

        # Batched: what is stored after the marker arrives together, read the same way.
        batched = bob.subscribe(marker.cursor, max_batch=8)
        async with contextlib.aclosing(batched):
            together = await asyncio.wait_for(anext(batched), DEADLINE_S)
        carried = notifications_in(together)
        assert [n.notification_id for n in carried[:2]] == [
            first.notification.notification_id,
            following.notification.notification_id,
        ]
        assert together.cursor == carried[-1].cursor
        assert notifications_in(first) == [first.notification]
        assert notifications_in(marker) == []


async def test_hold_cancels_the_block_and_raises_lock_lost_when_the_lock_is_lost(
    stack, etcd
) -> None:
    direct = Etcd(etcd.endpoint, call_timeout=5)
    body_cancelled = False
    try:
        async with stack.client("dev-alice") as alice:
            with pytest.raises(LockLost) as caught:
                async with alice.hold("user:alice:lost", ttl_seconds=5) as lock:
                    await direct.revoke_lease(lock.lock.lease_id)
                    try:
                        await asyncio.sleep(DEADLINE_S)
                    except asyncio.CancelledError:
                        body_cancelled = True
                        raise
            assert body_cancelled
            assert caught.value.metadata["lost_reason"] == "LOST_REASON_LEASE_EXPIRED"
            # The client stays usable: the same key can be held again.
            async with alice.hold("user:alice:lost", ttl_seconds=5) as again:
                assert again.token > lock.token
    finally:
        await direct.close()


async def test_a_small_file_is_one_request_and_each_collaborator_hears_once(
    stack, tmp_path: Path
) -> None:
    """A file that fits in one chunk goes by UploadFile: the upload exists only once it is
    completed (on_created sees it COMPLETED), a re-run is the same upload, and the
    collaborator's stream carries one notification for the version."""
    async with stack.client("dev-alice") as alice, stack.client("dev-bob") as bob:
        source = tmp_path / "note.txt"
        source.write_bytes(b"first")
        first = await alice.upload(source, chunk_size=CHUNK)
        assert first.status == upload_pb2.UPLOAD_STATUS_COMPLETED and first.file_version == 1
        await alice.share(first.file_id, "bob", upload_pb2.ROLE_EDITOR)
        stream = bob.subscribe()
        marker = await anext(stream)
        assert marker.cursor
        source.write_bytes(b"second, for bob")
        created: list[upload_pb2.Upload] = []
        progress: list[tuple[int, int]] = []
        done = await alice.upload(
            source,
            to_file_id=first.file_id,
            chunk_size=CHUNK,
            on_created=created.append,
            progress=lambda d, t: progress.append((d, t)),
        )
        assert [u.status for u in created] == [upload_pb2.UPLOAD_STATUS_COMPLETED]
        assert done.file_version == 3  # after the share's version
        assert progress == [(len(b"second, for bob"), len(b"second, for bob"))]
        again = await alice.upload(source, to_file_id=first.file_id, chunk_size=CHUNK)
        assert again.upload_id == done.upload_id and again.file_version == 3
        # The share's notification (version 2) may come first; then the version's.
        heard = await asyncio.wait_for(anext(stream), DEADLINE_S)
        if heard.notification.version == 2:
            heard = await asyncio.wait_for(anext(stream), DEADLINE_S)
        assert (heard.notification.file_id, heard.notification.version) == (first.file_id, 3)
        await stream.aclose()
        # Everything stored for bob since the marker, at once: the version once.
        batched = bob.subscribe(marker.cursor, max_batch=64)
        async with contextlib.aclosing(batched):
            together = notifications_in(await asyncio.wait_for(anext(batched), DEADLINE_S))
        assert [(n.file_id, n.version) for n in together if n.version != 2] == [(first.file_id, 3)]
        # No upload left open, none made twice.
        assert [u.upload_id for u in await alice.list_uploads()].count(done.upload_id) == 1


async def _inbox(notify_address: str, user: str, file_id: str) -> list[notify_pb2.Notification]:
    """`user`'s notifications about `file_id` (their whole inbox, all pages)."""
    async with grpc.aio.insecure_channel(notify_address) as channel:
        stub = notify_pb2_grpc.NotifyServiceStub(channel)
        md = (("authorization", f"Bearer tok-{user}"),)
        out: list[notify_pb2.Notification] = []
        token = ""
        while True:
            page = await stub.ListNotifications(
                notify_pb2.ListNotificationsRequest(page_size=500, page_token=token), metadata=md
            )
            out += [n for n in page.notifications if n.file_id == file_id]
            token = page.next_page_token
            if not token:
                return out


async def test_share_many_grants_1000_users_in_one_call_and_tells_each_once(
    stack, tmp_path: Path
) -> None:
    """Issue 37, part 4: 1,000 grants go in one ShareFileBatch (one version), and every
    collaborator, each of the 1,000 included, finds one notification of it in their inbox;
    an existing collaborator hears it live. Sent again, it changes nothing."""
    users = [f"s{i:04d}" for i in range(1000)]
    async with stack.client("dev-alice") as alice, stack.client("dev-bob") as bob:
        source = tmp_path / "all-hands.txt"
        source.write_bytes(b"agenda")
        up = await alice.upload(source, chunk_size=CHUNK)
        await alice.share(up.file_id, "bob", upload_pb2.ROLE_VIEWER)
        stream = bob.subscribe()
        await asyncio.wait_for(anext(stream), DEADLINE_S)  # the "now" marker
        started = time.perf_counter()
        result = await alice.share_many(
            up.file_id, dict.fromkeys(users, upload_pb2.ROLE_VIEWER), expected_version=2
        )
        took = time.perf_counter() - started
        assert (result.added, result.changed, result.unchanged) == (1000, 0, 0)
        assert result.file.version == 3
        assert len(await alice.collaborators(up.file_id)) == 1001
        heard = await asyncio.wait_for(anext(stream), DEADLINE_S)
        if heard.notification.version == 2:  # bob's own share may still be on its way
            heard = await asyncio.wait_for(anext(stream), DEADLINE_S)
        assert (heard.notification.file_id, heard.notification.version) == (up.file_id, 3)
        assert "1000 people" in heard.notification.summary
        await stream.aclose()
        # Every grantee's inbox: exactly one notification, of version 3 (the relay and the
        # fan-out run after the answer: poll each inbox until it is there).
        deadline = time.monotonic() + DEADLINE_S
        waiting = set(users)
        gate = asyncio.Semaphore(32)

        async def inbox(user: str) -> tuple[str, list[notify_pb2.Notification]]:
            async with gate:
                return user, await _inbox(stack.notify, user, up.file_id)

        while waiting:
            for user, got in await asyncio.gather(*(inbox(u) for u in sorted(waiting))):
                assert len(got) <= 1, f"{user} was told {len(got)} times"
                if got:
                    assert got[0].version == 3 and got[0].actor_user_id == "alice"
                    waiting.discard(user)
            assert time.monotonic() < deadline, f"{len(waiting)} grantees never heard"
            if waiting:
                await asyncio.sleep(0.2)  # poll interval of the wait above
        print(f"1,000 grants in one ShareFileBatch: {took * 1000:.0f} ms")
        again = await alice.share_many(up.file_id, dict.fromkeys(users, upload_pb2.ROLE_VIEWER))
        assert (again.unchanged, again.file.version) == (1000, 3)
