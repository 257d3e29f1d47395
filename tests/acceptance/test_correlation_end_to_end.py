"""One correlation id followed end to end through real service processes' JSON logs
(seed 004): the PutChunks of a new version of a shared file, the upload's status changes,
the merge job, the file lock (the lock service's Acquire and Hold), the commit with its
fencing token, the outbox relay's publish, notify's Ingest, the fan-out job, and the
notification the collaborator receives — every line asserted under the one id, except the
lines of a call or job shared by several events of the file (an IngestBatch, a fan-out job
of a chain), which carry the first event's id and are found by what this event's lines
name.

Three processes (locks on etcd, notify, upload) with SERENTAK_LOG_FORMAT=json; SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from pathlib import Path

import grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.services import ServiceProcess, service_process
from upload.upload_helpers import chunk_request, create_request, split

CHUNK = 1024
DEADLINE_S = 60


def _md(token: str, cid: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"), ("x-correlation-id", cid))


def _lines(proc: ServiceProcess, cid: str | None) -> list[dict]:
    """`proc`'s JSON log records under correlation id `cid` (every record if None)."""
    records = [json.loads(x) for x in proc.log_text().splitlines() if x.startswith("{")]
    return [r for r in records if cid is None or r.get("correlation_id") == cid]


async def _relay_call_completed(notify: ServiceProcess, cid: str) -> None:
    """Wait until the relay's call that carried the event completed OK: an Ingest under
    `cid`, or an IngestBatch, which is logged under its first event's id (the relay
    batches a file's events that are pending together)."""
    service = "/serentak.notify.v1.NotifyService/"
    async with asyncio.timeout(DEADLINE_S):
        while True:
            records = [json.loads(x) for x in notify.log_text().splitlines() if x.startswith("{")]
            if any(
                r["event"] == "rpc_completed"
                and r.get("code") == "OK"
                and (
                    (r.get("method") == service + "Ingest" and r.get("correlation_id") == cid)
                    or r.get("method") == service + "IngestBatch"
                )
                for r in records
            ):
                return
            await asyncio.sleep(0.05)


async def _completed(stub, upload_id: str, md) -> upload_pb2.Upload:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(DEADLINE_S):
        while True:
            up = await stub.GetUpload(upload_pb2.GetUploadRequest(upload_id=upload_id), metadata=md)
            if up.status == upload_pb2.UPLOAD_STATUS_COMPLETED:
                return up
            assert up.status != upload_pb2.UPLOAD_STATUS_FAILED, up.failure_reason
            await asyncio.sleep(0.05)


async def _logged(proc: ServiceProcess, cid: str | None, event: str, **match: object) -> list[dict]:
    """Wait until `proc` has logged `event` (with `match`) under `cid` (any if None); its
    lines."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            found = [
                r
                for r in _lines(proc, cid)
                if r["event"] == event and all(r.get(k) == v for k, v in match.items())
            ]
            if found:
                return found
            await asyncio.sleep(0.05)


async def _upload(stub, data: bytes, md, **target) -> upload_pb2.Upload:  # type: ignore[no-untyped-def]
    if "file_id" in target:
        request = upload_pb2.CreateUploadRequest(
            file_id=target["file_id"],
            total_chunks=len(split(data, CHUNK)),
            total_size=len(data),
            chunk_size=CHUNK,
        )
    else:
        request = create_request(data, CHUNK, **target)
    up = await stub.CreateUpload(request, metadata=md)
    for i, piece in enumerate(split(data, CHUNK)):
        await stub.PutChunk(chunk_request(up.upload_id, i, piece), metadata=md)
    return await _completed(stub, up.upload_id, md)


async def test_one_correlation_id_from_put_chunk_to_the_notification(
    database_url: str, tmp_path: Path, etcd, request
) -> None:
    if database_url.startswith("sqlite"):
        notify_url = f"sqlite+aiosqlite:///{tmp_path / 'notify.db'}"
    else:
        notify_url = request.getfixturevalue("postgres").create()
    json_logs = {"SERENTAK_LOG_FORMAT": "json", "SERENTAK_WORKER_POLL_SECONDS": "0.05"}
    with contextlib.ExitStack() as stack:

        def start(name: str, env: dict[str, str]) -> ServiceProcess:
            (tmp_path / name).mkdir()
            return stack.enter_context(service_process(name, tmp_path / name, {**json_logs, **env}))

        locks, notify = await asyncio.gather(
            asyncio.to_thread(
                start,
                "locks",
                {
                    "SERENTAK_ETCD_ENDPOINT": etcd.endpoint,
                    "SERENTAK_LOCK_PREFIX": f"/e2e-{uuid.uuid4().hex}/",
                },
            ),
            asyncio.to_thread(start, "notify", {"SERENTAK_NOTIFY_DATABASE_URL": notify_url}),
        )
        upload = await asyncio.to_thread(
            start,
            "upload",
            {
                "SERENTAK_UPLOAD_DATABASE_URL": database_url,
                "SERENTAK_LOCKS_ADDRESS": locks.address,
                "SERENTAK_NOTIFY_ADDRESS": notify.address,
                "SERENTAK_PUBLISH_EVENTS": "true",
                "SERENTAK_MIN_CHUNK_SIZE": str(CHUNK),
            },
        )
        async with (
            grpc.aio.insecure_channel(upload.address) as uch,
            grpc.aio.insecure_channel(notify.address) as nch,
        ):
            uploads = upload_pb2_grpc.UploadServiceStub(uch)
            files = upload_pb2_grpc.FileServiceStub(uch)
            notes = notify_pb2_grpc.NotifyServiceStub(nch)
            setup = _md("dev-alice", f"setup-{uuid.uuid4().hex[:8]}")
            first = await _upload(uploads, os.urandom(CHUNK * 2), setup, name="shared.bin")
            await files.ShareFile(
                upload_pb2.ShareFileRequest(
                    file_id=first.file_id, user_id="bob", role=upload_pb2.ROLE_VIEWER
                ),
                metadata=setup,
            )
            bob = notes.Subscribe(
                notify_pb2.SubscribeRequest(device_id="bob-laptop"),
                metadata=_md("dev-bob", f"bob-{uuid.uuid4().hex[:8]}"),
            )
            marker = await bob.read()  # the stream is live from here
            assert not marker.notification.notification_id

            # The one id: every PutChunk of the new version carries it.
            cid = f"e2e-{uuid.uuid4().hex[:12]}"
            done = await _upload(
                uploads, os.urandom(CHUNK * 3), _md("dev-alice", cid), file_id=first.file_id
            )

            async def content_update() -> notify_pb2.Notification:
                while True:
                    n = (await bob.read()).notification
                    if n.event_type == "file.content.updated" and n.version == done.file_version:
                        return n

            async with asyncio.timeout(DEADLINE_S):
                seen = await content_update()
            bob.cancel()
            # The notification bob received names the id it all started with.
            assert seen.correlation_id == cid and seen.file_id == first.file_id

            # upload: chunks, transitions, merge, lock, commit, relay.
            await _logged(upload, cid, "outbox_event_published")
            up_lines = _lines(upload, cid)
            up_events = [r["event"] for r in up_lines]

            def of(event: str) -> list[dict]:
                return [r for r in up_lines if r["event"] == event]

            assert sorted(r["chunk_index"] for r in of("chunk_stored")) == [0, 1, 2]
            assert all(r["upload_id"] == done.upload_id for r in of("chunk_received"))
            assert [r["transition"] for r in of("upload_status_changed")] == [
                "uploading → merging",
                "merging → completed",
            ]
            (job,) = [r for r in of("job_started") if r.get("job_type") == "upload.merge"]
            (locked,) = of("merge_lock_acquired")
            (committed,) = of("merge_completed")
            assert locked["fencing_token"] == committed["fencing_token"] > 0
            assert committed["version"] == done.file_version
            (published,) = [
                r for r in of("outbox_event_published") if r["version"] == done.file_version
            ]
            order = [
                up_events.index("chunk_received"),
                up_events.index("upload_status_changed"),
                up_lines.index(job),
                up_events.index("merge_lock_acquired"),
                up_events.index("merge_completed"),
                up_lines.index(published),
            ]
            assert order == sorted(order), order

            # locks: the merge's Acquire (a request on LockClient's Session stream, under
            # the request's own id) and the Hold that kept the lease alive.
            acquired = await _logged(
                locks,
                cid,
                "rpc_completed",
                method="/serentak.locks.v1.LockService/Session.Acquire",
            )
            assert acquired[0]["code"] == "OK"
            await _logged(locks, cid, "rpc_completed", method="/serentak.locks.v1.LockService/Hold")

            # notify: the Ingest the relay made, the event accepted, its fan-out job.
            ingested = await _logged(notify, cid, "event_ingested", version=done.file_version)
            assert ingested[0]["accepted"] and ingested[0]["outcome"] == "INGEST_OUTCOME_APPLIED"
            await _relay_call_completed(notify, cid)
            # The notifications, written by Ingest itself (a small audience with no earlier
            # event of the file waiting for its job) or by a fan-out job.
            (written,) = await _logged(
                notify, cid, "notifications_written", version=done.file_version
            )
            assert written["fanout"] in ("inline", "job")
            if written["fanout"] == "job":
                # One job can fan out a file's chain of pending events; it runs under the
                # first one's correlation id, and this event's line names it.
                assert written["job_type"] == "notify_fanout"
                fanned = await _logged(notify, None, "job_finished", job_id=written["job_id"])
                assert fanned[0]["outcome"] == "completed"
