"""The trash purge (services/upload/files/trash.py): items deleted longer ago than the
retention leave with everything under them, their shares and rows go, quota is released
at once, the next reclaim deletes their bytes and then their upload rows; younger items
and restored ones stay; a restore racing the purge either keeps the item or finds it gone;
the periodic job is registered and purges. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select, update
from upload.tree_helpers import folder, role, share

from services.common.audit.models import audit_events
from services.common.jobs import NewJob, enqueue
from services.upload.files.trash import PURGE_TRASH_JOB, purge_trash
from services.upload.models import FileRow, ShareRow, UploadRow, utcnow
from services.upload.storage.lifecycle import ReclaimPolicy, reclaim
from services.upload.storage.quota_use import highest_quota_use

DAY = timedelta(days=1)
RETENTION = timedelta(days=30)
DEADLINE_S = 30


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # The periodic sweeps stay out of the way: the tests run them, or enqueue the job.
    return {
        "reclaim_interval_seconds": 3600,
        "trash_purge_interval_seconds": 3600,
        "trash_retention_days": 30,
    }


async def _put(client, data: bytes, name: str, folder_id: str = "") -> upload_pb2.Upload:
    done = await client.uploads.UploadFile(
        upload_pb2.UploadFileRequest(
            new_file=upload_pb2.NewFileTarget(folder_id=folder_id, name=name), data=data
        ),
        metadata=client.metadata,
    )
    return done.upload


async def _delete(client, file_id: str) -> None:
    await client.files.DeleteFile(
        upload_pb2.DeleteFileRequest(file_id=file_id), metadata=client.metadata
    )


async def _used(sessions) -> int:
    async with sessions() as session:
        return (await highest_quota_use(session, 1 << 40)).used_bytes


async def _exists(sessions, model, *where) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(model).where(*where)))


async def test_due_items_go_with_their_subtree_bytes_and_quota(cluster, sessions) -> None:
    alice = cluster["alice"]
    box = await folder(alice, "box")
    inner = await _put(alice, os.urandom(3000), "inner.bin", box)
    loose = await _put(alice, os.urandom(2000), "loose.bin")
    kept = await _put(alice, os.urandom(1000), "kept.bin")
    await share(alice, inner.file_id, "bob")
    await share(alice, loose.file_id, "bob")
    await _delete(alice, box)
    await _delete(alice, loose.file_id)
    used = await _used(sessions)
    assert used == 6000
    before = REGISTRY.get_sample_value("serentak_upload_trash_purged_total", {"kind": "file"})
    # Not yet due: everything stays.
    assert (await purge_trash(sessions, RETENTION)).items == 0
    assert await role(alice, box) is not None
    # Past the retention: the folder (with its live file) and the loose file go.
    result = await purge_trash(sessions, RETENTION, now=utcnow() + RETENTION + DAY)
    assert (result.items, result.rows, result.file_bytes) == (2, 3, 5000)
    after = REGISTRY.get_sample_value("serentak_upload_trash_purged_total", {"kind": "file"})
    assert after - (before or 0) == 1
    for file_id in (box, inner.file_id, loose.file_id):
        assert await role(alice, file_id) is None
        assert await role(cluster["bob"], file_id) is None
        assert await _exists(sessions, ShareRow, ShareRow.file_id == file_id) == 0
    assert await role(alice, kept.file_id) is not None
    assert await _used(sessions) == 1000
    # The audit trail names each purged item; the live file under the folder was announced.
    async with sessions() as session:
        purged = (
            await session.execute(
                select(audit_events.c.target_id, audit_events.c.detail).where(
                    audit_events.c.action == "file.purged"
                )
            )
        ).all()
    assert {t: d["items"] for t, d in purged} == {box: 2, loose.file_id: 1}
    # The next reclaim deletes every version's bytes, then the upload rows.
    blobs = cluster.blobs
    assert [o async for o in blobs.list_objects(f"files/{inner.file_id}")]
    got = await reclaim(sessions, blobs, ReclaimPolicy())
    assert got.bytes["retired"] == 5000
    for up in (inner, loose):
        assert [o async for o in blobs.list_objects(f"files/{up.file_id}")] == []
        assert await _exists(sessions, UploadRow, UploadRow.id == up.upload_id) == 0
    assert await _exists(sessions, UploadRow, UploadRow.id == kept.upload_id) == 1


async def test_a_restored_item_stays(cluster, sessions) -> None:
    alice = cluster["alice"]
    up = await _put(alice, b"x" * 10, "back.bin")
    await _delete(alice, up.file_id)
    await alice.files.RestoreFile(
        upload_pb2.RestoreFileRequest(file_id=up.file_id), metadata=alice.metadata
    )
    assert (await purge_trash(sessions, timedelta(0), now=utcnow() + DAY)).items == 0
    assert await role(alice, up.file_id) is not None


async def test_restores_racing_the_purge_keep_or_lose_each_item_whole(cluster, sessions) -> None:
    alice = cluster["alice"]
    ups = [await _put(alice, os.urandom(100), f"r{i}.bin") for i in range(12)]
    for up in ups:
        await _delete(alice, up.file_id)

    async def restore(file_id: str) -> bool:
        try:
            await alice.files.RestoreFile(
                upload_pb2.RestoreFileRequest(file_id=file_id), metadata=alice.metadata
            )
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return False
        return True

    purge = asyncio.create_task(purge_trash(sessions, timedelta(0), now=utcnow() + DAY))
    restored = await asyncio.gather(*(restore(up.file_id) for up in ups))
    result = await purge
    assert result.items == restored.count(False)
    for up, back in zip(ups, restored, strict=True):
        rows = await _exists(sessions, FileRow, FileRow.id == up.file_id)
        assert rows == (1 if back else 0)
    assert await _used(sessions) == 100 * restored.count(True)


async def test_the_periodic_job_purges_with_the_settings(cluster, sessions) -> None:
    alice = cluster["alice"]
    up = await _put(alice, b"y" * 10, "job.bin")
    await _delete(alice, up.file_id)
    async with sessions.begin() as session:
        # Deleted 31 days ago, as far as the purge can tell.
        await session.execute(
            update(FileRow)
            .where(FileRow.id == up.file_id)
            .values(deleted_at=utcnow() - RETENTION - DAY)
        )
        await enqueue(
            session,
            NewJob(
                job_type=PURGE_TRASH_JOB,
                payload={},
                partition_key="test:purge_trash",
                idempotency_key="test:purge_trash",
            ),
        )
    # The job's run purges the item (polled, with a deadline).
    deadline = time.monotonic() + DEADLINE_S
    while await _exists(sessions, FileRow, FileRow.id == up.file_id):
        assert time.monotonic() < deadline, "the purge_trash job never purged the item"
        await asyncio.sleep(0.05)
    assert await role(alice, up.file_id) is None
