"""The audit trail (services/common/audit) on the upload service: every change of access or
content leaves one row with its principal, tenant, target, time and correlation id, in the
change's transaction (a refused or rolled-back change leaves none); downloads and operators'
replays and purges are recorded; AdminService/ListAuditEvents filters by tenant, principal,
target and time, in pages, for operators only. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2
from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, insert, select
from upload.tree_helpers import folder, move, share
from upload.upload_helpers import chunk_request, create_request, expect_error, wait_status

from services.common.audit.models import audit_events
from services.common.jobs.models import dead_letters, utcnow
from services.common.outbox.models import outbox_events
from services.upload.files.events import record_file_event
from services.upload.models import FileRow

OPS = (("authorization", "Bearer dev-ops"),)


async def _put(client, data: bytes, name: str) -> upload_pb2.UploadFileResponse:
    return await client.uploads.UploadFile(
        upload_pb2.UploadFileRequest(new_file=upload_pb2.NewFileTarget(name=name), data=data),
        metadata=client.metadata,
    )


async def _trail(cluster, **filters: Any) -> list[admin_pb2.AuditEvent]:
    """Every page of ListAuditEvents with `filters`, newest first."""
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    events: list[admin_pb2.AuditEvent] = []
    token = ""
    while True:
        page = await admin.ListAuditEvents(
            admin_pb2.ListAuditEventsRequest(page_token=token, **filters), metadata=OPS
        )
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            return events


async def _count(sessions, table, *where) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(table).where(*where)))


async def test_each_change_and_download_leaves_one_row(cluster) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    made = await _put(alice, b"v1" * 100, "doc.bin")
    file_id = made.file.file_id
    # A new version through the merge job (the chunked path), as bob, an editor.
    await share(alice, file_id, "bob")
    data = b"v2" * 600
    up = await bob.uploads.CreateUpload(
        create_request(data, 1024, file_id=file_id), metadata=bob.metadata
    )
    await bob.uploads.PutChunk(chunk_request(up.upload_id, 0, data[:1024]), metadata=bob.metadata)
    await bob.uploads.PutChunk(chunk_request(up.upload_id, 1, data[1024:]), metadata=bob.metadata)
    await wait_status(bob, up.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    await alice.files.ShareFileBatch(
        upload_pb2.ShareFileBatchRequest(
            file_id=file_id,
            grants=[upload_pb2.ShareGrant(user_id="carol", role=upload_pb2.ROLE_VIEWER)],
        ),
        metadata=alice.metadata,
    )
    cid = f"audit-{uuid.uuid4().hex}"
    await alice.files.UnshareFile(
        upload_pb2.UnshareFileRequest(file_id=file_id, user_id="carol"),
        metadata=alice.md(**{"x-correlation-id": cid}),
    )
    box = await folder(alice, "box")
    await move(alice, file_id, box)
    async for _ in bob.files.Download(
        upload_pb2.DownloadRequest(file_id=file_id), metadata=bob.metadata
    ):
        pass
    await alice.files.DeleteFile(
        upload_pb2.DeleteFileRequest(file_id=file_id), metadata=alice.metadata
    )
    await alice.files.RestoreFile(
        upload_pb2.RestoreFileRequest(file_id=file_id), metadata=alice.metadata
    )
    trail = await _trail(cluster, target_id=file_id)
    assert [(e.action, e.principal) for e in reversed(trail)] == [
        ("file.content.updated", "alice"),
        ("file.shared", "alice"),
        ("file.content.updated", "bob"),
        ("file.shared", "alice"),
        ("file.unshared", "alice"),
        ("file.moved", "alice"),
        ("file.downloaded", "bob"),
        ("file.deleted", "alice"),
        ("file.restored", "alice"),
    ]
    assert {(e.tenant_id, e.target_type) for e in trail} == {("acme", "file")}
    by_action = {e.action: e for e in reversed(trail)}  # the newest of each action
    assert by_action["file.unshared"].correlation_id == cid
    assert json.loads(by_action["file.unshared"].detail_json)["user_id"] == "carol"
    shares = [json.loads(e.detail_json) for e in trail if e.action == "file.shared"]
    assert shares[0]["grants"] == [{"user_id": "carol", "role": "viewer"}]
    assert (shares[1]["user_id"], shares[1]["role"]) == ("bob", "editor")
    assert json.loads(by_action["file.content.updated"].detail_json)["upload_id"] == up.upload_id
    assert json.loads(by_action["file.moved"].detail_json)["new_parent_id"] == box
    # Newest first, each with its own id and time.
    assert [e.id for e in trail] == sorted((e.id for e in trail), reverse=True)
    assert all(e.at.seconds > 0 for e in trail)


async def test_a_refused_or_rolled_back_change_leaves_no_row(cluster, sessions) -> None:
    alice = cluster["alice"]
    made = await _put(alice, b"x" * 10, "kept.bin")
    file_id = made.file.file_id
    before = await _count(sessions, audit_events, audit_events.c.target_id == file_id)
    events = await _count(sessions, outbox_events, outbox_events.c.aggregate_id == file_id)
    # The grant is written, then the version check refuses the change: all of it rolls back.
    await expect_error(
        alice.files.ShareFile(
            upload_pb2.ShareFileRequest(
                file_id=file_id,
                user_id="bob",
                role=upload_pb2.ROLE_EDITOR,
                expected_version=made.file.version + 5,
            ),
            metadata=alice.metadata,
        ),
        grpc.StatusCode.ABORTED,
        "VERSION_MISMATCH",
    )
    # A change whose transaction fails after its audit row was written.
    with pytest.raises(RuntimeError, match="forced"):
        async with sessions.begin() as session:
            file = await session.get(FileRow, file_id)
            assert file is not None
            await record_file_event(
                session, "file.renamed", file, "alice", old_name="kept.bin", new_name="x.bin"
            )
            assert (
                await session.scalar(
                    select(func.count()).where(audit_events.c.target_id == file_id)
                )
                == before + 1
            )
            raise RuntimeError("forced")
    assert await _count(sessions, audit_events, audit_events.c.target_id == file_id) == before
    assert await _count(sessions, outbox_events, outbox_events.c.aggregate_id == file_id) == events
    assert [e.action for e in await _trail(cluster, target_id=file_id)] == ["file.content.updated"]


async def test_filters_by_tenant_principal_target_and_time_in_pages(cluster) -> None:
    alice, bob, mallory = cluster["alice"], cluster["bob"], cluster["mallory"]
    a = await _put(alice, b"a" * 10, "a.bin")
    await share(alice, a.file.file_id, "bob")
    async for _ in bob.files.Download(
        upload_pb2.DownloadRequest(file_id=a.file.file_id), metadata=bob.metadata
    ):
        pass
    m = await _put(mallory, b"m" * 10, "m.bin")
    everything = await _trail(cluster, page_size=2)
    assert len({e.id for e in everything}) == len(everything) >= 4
    assert {e.target_id for e in await _trail(cluster, tenant_id="evil")} == {m.file.file_id}
    assert [e.action for e in await _trail(cluster, principal="bob")] == ["file.downloaded"]
    assert [e.action for e in await _trail(cluster, tenant_id="acme", principal="alice")] == [
        "file.shared",
        "file.content.updated",
    ]
    # Time: since inclusive, until exclusive.
    newest = everything[0]
    at = newest.at.ToDatetime()
    since = timestamp_pb2.Timestamp()
    since.FromDatetime(at)
    later = timestamp_pb2.Timestamp()
    later.FromDatetime(at + timedelta(microseconds=1))
    assert newest.id in {e.id for e in await _trail(cluster, since=since)}
    assert newest.id not in {e.id for e in await _trail(cluster, until=since)}
    assert await _trail(cluster, since=later) == []
    assert {e.id for e in await _trail(cluster, until=later)} == {e.id for e in everything}


async def test_only_operators_query_and_arguments_are_checked(cluster) -> None:
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    request = admin_pb2.ListAuditEventsRequest()
    for md in (cluster["alice"].metadata, (("authorization", "Bearer dev-service-notify"),)):
        await expect_error(
            admin.ListAuditEvents(request, metadata=md),
            grpc.StatusCode.PERMISSION_DENIED,
            "OPS_ROLE_REQUIRED",
        )
    now = timestamp_pb2.Timestamp()
    now.GetCurrentTime()
    for bad, field in (
        (admin_pb2.ListAuditEventsRequest(page_token="x"), "page_token"),
        (admin_pb2.ListAuditEventsRequest(page_size=-1), "page_size"),
        (admin_pb2.ListAuditEventsRequest(since=now, until=now), "until"),
        (admin_pb2.ListAuditEventsRequest(tenant_id="t" * 256), "tenant_id"),
    ):
        info = await expect_error(
            admin.ListAuditEvents(bad, metadata=OPS),
            grpc.StatusCode.INVALID_ARGUMENT,
            info_reason(field),
        )
        assert info.metadata["field"] == field


def info_reason(field: str) -> str:
    return {"page_token": "INVALID_PAGE_TOKEN", "until": "EMPTY_TIME_RANGE"}.get(
        field, "INVALID_ARGUMENT"
    )


async def test_operators_replays_and_purges_are_recorded(cluster, sessions) -> None:
    admin = admin_pb2_grpc.AdminServiceStub(cluster.channel)
    now = utcnow()
    async with sessions.begin() as session:
        dead_id = (
            await session.execute(
                insert(dead_letters)
                .values(
                    job_id=uuid.uuid4().hex,
                    job_type="upload.reclaim",
                    partition_key="p",
                    idempotency_key=f"k-{uuid.uuid4().hex}",
                    payload={},
                    correlation_id="c",
                    error_class="permanent",
                    error_type="E",
                    error_message="m",
                    traceback="",
                    attempts=1,
                    worker_id="w",
                    enqueued_at=now,
                    dead_at=now,
                )
                .returning(dead_letters.c.id)
            )
        ).scalar_one()
    replay = await admin.ReplayDeadLetter(
        admin_pb2.ReplayDeadLetterRequest(id=dead_id), metadata=OPS
    )
    # An unknown dead letter is refused: nothing recorded.
    await expect_error(
        admin.ReplayDeadLetter(admin_pb2.ReplayDeadLetterRequest(id=dead_id + 1000), metadata=OPS),
        grpc.StatusCode.NOT_FOUND,
        "DEAD_LETTER_NOT_FOUND",
    )
    purged = await admin.PurgeDeadLetters(
        admin_pb2.PurgeDeadLettersRequest(job_type="upload.reclaim"), metadata=OPS
    )
    trail = await _trail(cluster, principal="service:ops")
    assert [(e.action, e.target_id, e.tenant_id) for e in trail] == [
        ("dead_letters.purged", "upload.reclaim", ""),
        ("dead_letter.replayed", str(dead_id), ""),
    ]
    assert json.loads(trail[0].detail_json)["purged"] == purged.purged == 1
    assert json.loads(trail[1].detail_json)["job_id"] == replay.job_id


async def test_an_abort_is_recorded_and_a_refused_one_is_not(cluster) -> None:
    alice = cluster["alice"]
    up = await alice.uploads.CreateUpload(
        create_request(b"z" * 2000, 1024, name="aborted.bin"), metadata=alice.metadata
    )
    request = upload_pb2.AbortUploadRequest(upload_id=up.upload_id)
    await alice.uploads.AbortUpload(request, metadata=alice.metadata)
    await expect_error(
        alice.uploads.AbortUpload(request, metadata=alice.metadata),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UPLOAD_NOT_ACTIVE",
    )
    trail = await _trail(cluster, target_id=up.upload_id)
    assert [(e.action, e.principal, e.target_type) for e in trail] == [
        ("upload.aborted", "alice", "upload")
    ]
    assert json.loads(trail[0].detail_json)["name"] == "aborted.bin"
