"""The long run, compressed: many cycles of upload (whole and chunked), new version, share,
unshare, download and delete on PostgreSQL, with every retention near zero and the purges
run after each cycle (trash purge, storage reclaim, runtime retention, change log; notify's
retention and runtime retention). After the first cycles, every table of the upload and
notify databases keeps the same row count and the blob store the same bytes: nothing the
cycles do is left behind (issue 33, parts 3 and 4)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from serentak.channels import open_channel
from serentak.credentials import ClientSecurity
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from sqlalchemy import func, select, text
from support.services import running_app
from upload.upload_helpers import chunk_request, create_request, split, wait_status

from services.common.db import create_engine, session_factory
from services.common.jobs import RuntimeOptions
from services.common.jobs.models import jobs
from services.common.jobs.periodic import KEEP_TICKS
from services.common.outbox.models import outbox_events
from services.common.retention import RuntimeRetention, purge_runtime
from services.locks.app import build_app as build_locks_app
from services.locks.settings import LocksSettings
from services.notify.app import build_app as build_notify_app
from services.notify.retention import purge as purge_notify
from services.notify.settings import NotifySettings
from services.upload.app import build_app as build_upload_app
from services.upload.files.change_log import purge_changes
from services.upload.files.trash import purge_trash
from services.upload.settings import UploadSettings
from services.upload.storage.blob_store import open_blob_store
from services.upload.storage.lifecycle import ReclaimPolicy, reclaim
from services.upload.sync.settings import SyncSettings

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

CYCLES = 12
WARM_UP = 2
CHUNK = 1024
DEADLINE_S = 30
# The periodic jobs run once at start and then not again during the test: the test runs
# the purges itself, after each cycle, so the counts it reads are not mid-purge.
RARELY = 1e6
ZERO = RuntimeRetention(
    outbox_seconds=0, applied_jobs_seconds=0, dead_letter_seconds=0, audit_seconds=0
)
# Notify's retention with every window at zero: read and unread notifications, finished
# inbox rows and retired aggregates all go.
NOTIFY_ZERO = {
    "read_older_than": timedelta(0),
    "inbox_older_than": timedelta(0),
    "unread_older_than": timedelta(0),
    "retired_older_than": timedelta(0),
}
NO_GRACE = ReclaimPolicy(
    failed_grace_seconds=0,
    version_keep_count=1,
    version_keep_days=0,
    orphan_grace_seconds=0.001,
    temp_grace_seconds=0.001,
)


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


ALICE, BOB, CAROL = _md("dev-alice"), _md("dev-bob"), _md("dev-carol")


async def _cycle(uploads, files, n: int) -> None:
    """One cycle of what users do, everything deleted at the end."""
    whole = await uploads.UploadFile(
        upload_pb2.UploadFileRequest(
            new_file=upload_pb2.NewFileTarget(name=f"whole-{n}.bin"),
            data=os.urandom(3000 + n),
        ),
        metadata=ALICE,
    )
    a = whole.file.file_id
    await uploads.UploadFile(
        upload_pb2.UploadFileRequest(file_id=a, data=os.urandom(2000 + n)), metadata=ALICE
    )
    data = os.urandom(3 * CHUNK - 5)
    made = await uploads.CreateUpload(
        create_request(data, CHUNK, name=f"chunked-{n}.bin"), metadata=ALICE
    )
    for i, piece in enumerate(split(data, CHUNK)):
        await uploads.PutChunk(chunk_request(made.upload_id, i, piece), metadata=ALICE)

    class Client:
        metadata = ALICE

    client = Client()
    client.uploads = uploads  # type: ignore[attr-defined]
    done = await wait_status(client, made.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    b = done.file_id
    await files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=a, user_id="bob", role=upload_pb2.ROLE_EDITOR),
        metadata=ALICE,
    )
    await files.ShareFileBatch(
        upload_pb2.ShareFileBatchRequest(
            file_id=b,
            grants=[
                upload_pb2.ShareGrant(user_id="bob", role=upload_pb2.ROLE_VIEWER),
                upload_pb2.ShareGrant(user_id="carol", role=upload_pb2.ROLE_EDITOR),
            ],
        ),
        metadata=ALICE,
    )
    await files.UnshareFile(
        upload_pb2.UnshareFileRequest(file_id=b, user_id="carol"), metadata=ALICE
    )
    async for _ in files.Download(upload_pb2.DownloadRequest(file_id=a), metadata=BOB):
        pass
    for file_id in (a, b):
        await files.DeleteFile(upload_pb2.DeleteFileRequest(file_id=file_id), metadata=ALICE)


async def _settled(*databases) -> None:
    """Until every job of each database (upload's, notify's) has run and every event is
    published (the relay's Ingest returns once notify has the event)."""
    deadline = time.monotonic() + DEADLINE_S
    for sessions in databases:
        while True:
            async with sessions() as session:
                left = await session.scalar(select(func.count()).select_from(jobs))
                unpublished = await session.scalar(
                    select(func.count()).where(outbox_events.c.published_at.is_(None))
                )
            if not left and not unpublished:
                break
            assert time.monotonic() < deadline, f"{left} jobs, {unpublished} events pending"
            await asyncio.sleep(0.05)  # poll interval of the wait above, not a stand-in


async def _rows(sessions) -> dict[str, int]:
    async with sessions() as session:
        tables = (
            (
                await session.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
                )
            )
            .scalars()
            .all()
        )
        return {
            t: int(await session.scalar(text(f'SELECT count(*) FROM "{t}"')) or 0)
            for t in sorted(tables)
            if not t.endswith("alembic_version")
        }


async def _bytes(blobs) -> int:
    return sum([o.size async for o in blobs.list_objects("uploads")]) + sum(
        [o.size async for o in blobs.list_objects("files")]
    )


async def test_tables_and_blob_bytes_stay_flat_over_many_cycles(
    postgres, tmp_path: Path, etcd
) -> None:
    upload_url, notify_url = postgres.create(), postgres.create()
    locks = build_locks_app(
        LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=f"/soak-{uuid.uuid4().hex}/")
    )
    notify = build_notify_app(
        NotifySettings(
            notify_database_url=notify_url,
            data_dir=tmp_path / "notify",
            worker_poll_seconds=0.05,
            retention_interval_seconds=RARELY,
            runtime_retention_interval_seconds=RARELY,
            rate_limit_window_seconds=86_400,
        )
    )
    async with running_app(locks) as lk, running_app(notify) as nt:
        settings = UploadSettings(
            upload_database_url=upload_url,
            data_dir=tmp_path / "upload",
            locks_address=f"127.0.0.1:{lk.app.bound_port}",
            notify_address=f"127.0.0.1:{nt.app.bound_port}",
            min_chunk_size=CHUNK,
            publish_events=True,
            inline_merge_max_bytes=0,  # the chunked upload goes through the merge job
            trash_retention_days=0,
            outbox_retention_seconds=0,
            applied_jobs_retention_seconds=0,
            dead_letter_retention_seconds=0,
            audit_retention_seconds=0,
            version_keep_count=1,
            version_keep_days=0,
            failed_upload_grace_seconds=0,
            expiry_interval_seconds=RARELY,
            reclaim_interval_seconds=RARELY,
            trash_purge_interval_seconds=RARELY,
            runtime_retention_interval_seconds=RARELY,
            change_log_purge_interval_seconds=RARELY,
            # One rate window for the whole soak: a new window's counters (the old ones
            # go with their window) would read as growth at a boundary.
            rate_limit_window_seconds=86_400,
        )
        upload = build_upload_app(
            settings,
            RuntimeOptions(node_id=f"soak-{uuid.uuid4().hex[:6]}", poll_interval=0.05),
            SyncSettings(webhook_port=0, client_state=f"state-{uuid.uuid4().hex}"),
        )
        engine, notify_engine = create_engine(upload_url), create_engine(notify_url)
        sessions, notify_sessions = session_factory(engine), session_factory(notify_engine)
        blobs = open_blob_store(settings)
        try:
            async with (
                running_app(upload) as up,
                open_channel(f"127.0.0.1:{up.app.bound_port}", ClientSecurity()) as channel,
            ):
                uploads = upload_pb2_grpc.UploadServiceStub(channel)
                files = upload_pb2_grpc.FileServiceStub(channel)
                seen: list[tuple[dict[str, int], dict[str, int], int]] = []
                purged_rows = notify_purged = 0
                for n in range(CYCLES):
                    await _cycle(uploads, files, n)
                    await _settled(sessions, notify_sessions)
                    trash = await purge_trash(sessions, timedelta(0))
                    assert trash.items == 2
                    # What the purge announced reaches notify before its retention runs.
                    await _settled(sessions, notify_sessions)
                    await reclaim(sessions, blobs, NO_GRACE)
                    purged_rows += sum((await purge_runtime(sessions, ZERO)).rows.values())
                    purged_rows += await purge_changes(sessions, timedelta(0))
                    swept = await purge_notify(notify_sessions, **NOTIFY_ZERO)
                    notify_purged += swept.notifications + swept.inbox_events
                    notify_purged += sum((await purge_runtime(notify_sessions, ZERO)).rows.values())
                    seen.append(
                        (await _rows(sessions), await _rows(notify_sessions), await _bytes(blobs))
                    )
        finally:
            await blobs.close()
            await engine.dispose()
            await notify_engine.dispose()
    # Work happened (events, keys, audit rows, notifications were written and purged) ...
    assert purged_rows > CYCLES * 10
    assert notify_purged > CYCLES * 10
    # ... and after the warm-up nothing grows: the same rows in every table of both
    # databases, the same bytes.
    base_rows, base_notify, base_bytes = seen[WARM_UP - 1]
    for rows, notify_rows, size in seen[WARM_UP:]:
        for now, base in ((rows, base_rows), (notify_rows, base_notify)):
            # Periodic ticks are kept for the last KEEP_TICKS ticks of each type: bounded.
            ticks = now.pop("periodic_ticks")
            assert ticks <= KEEP_TICKS * 10
            assert now == {k: v for k, v in base.items() if k != "periodic_ticks"}
        assert size == base_bytes
    assert base_rows["files"] == 1  # alice's root folder
    for table in ("shares", "uploads", "upload_chunks", "outbox_events", "audit_events"):
        assert base_rows[table] == 0, table
    for table in ("notifications", "notify_inbox", "notify_aggregate_versions", "jobs"):
        assert base_notify[table] == 0, table
