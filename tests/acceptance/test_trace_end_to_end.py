"""One trace across three real service processes (locks on etcd, upload, notify), each
exporting over OTLP/gRPC to a receiver this test runs (the official
`opentelemetry.proto` TraceService): the client's traceparent on CreateUpload and the
PutChunks of a new version of a shared file; in upload, the merge job, the file lock's
hold, the commit and the outbox relay's publish; in locks, the Hold stream the merge kept
the lock with; in notify, the Ingest the relay made and the fan-out that wrote the
collaborator's notification, by Ingest itself or a job (or, when the relay batched this
event behind another's, notify's spans of this event's part of the batch, in this trace).
Upload on SQLite and PostgreSQL, notify on SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path

import grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.services import ServiceProcess, service_process
from support.tracing import ExportedSpan, OtlpReceiver
from upload.upload_helpers import chunk_request, split

CHUNK = 1024
DEADLINE_S = 60
UPLOADS = "/serentak.upload.v1.UploadService/"
INGESTS = (
    "/serentak.notify.v1.NotifyService/Ingest",
    "/serentak.notify.v1.NotifyService/IngestBatch",
)
HOLD = "/serentak.locks.v1.LockService/Hold"


async def _completed(stub, upload_id: str, md) -> upload_pb2.Upload:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(DEADLINE_S):
        while True:
            up = await stub.GetUpload(upload_pb2.GetUploadRequest(upload_id=upload_id), metadata=md)
            if up.status == upload_pb2.UPLOAD_STATUS_COMPLETED:
                return up
            assert up.status != upload_pb2.UPLOAD_STATUS_FAILED, up.failure_reason
            await asyncio.sleep(0.05)


# Notify's spans for an event: the call's (the relay sent it alone, or first of a batch)
# or, when a batch ran in another event's trace, the spans of this event's part of it.
NOTIFY_INGEST = {*INGESTS, "notify ingest_event"}
# The write of its notifications: a fan-out job's, this event's part of another trace's
# write, or the call's own span when Ingest wrote them itself in this event's trace.
NOTIFY_FANOUT = {"job notify_fanout", "notify fanout_event", *INGESTS}
RELAY = {"outbox publish", "outbox publish_batch"}


def _whole(spans: list[ExportedSpan]) -> bool:
    """Every process has exported its spans of every step (each exports on its own
    schedule: notify's fan-out may arrive before upload's relay span, which ends after
    notify answers)."""
    names = {(s.service, s.name) for s in spans}
    return (
        any(("serentak-upload", n) in names for n in RELAY)
        and ("serentak-upload", "upload commit_version") in names
        and ("serentak-locks", HOLD) in names
        and ("serentak-upload", HOLD) in names  # its Hold call: ends when it sees the stream end
        and any(("serentak-notify", n) in names for n in NOTIFY_INGEST)
        and any(("serentak-notify", n) in names for n in NOTIFY_FANOUT)
    )


async def test_one_trace_from_the_put_chunks_to_the_fan_out_in_three_processes(
    database_url: str, tmp_path: Path, etcd
) -> None:
    receiver = OtlpReceiver()
    await receiver.start()
    common = {
        "SERENTAK_OTLP_ENDPOINT": receiver.endpoint,
        # The SDK's batch delay (5 s by default): spans reach the receiver soon after they end.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "SERENTAK_WORKER_POLL_SECONDS": "0.05",
    }
    try:
        with contextlib.ExitStack() as stack:

            def start(name: str, env: dict[str, str]) -> ServiceProcess:
                (tmp_path / name).mkdir()
                return stack.enter_context(service_process(name, tmp_path / name, common | env))

            locks, notify = await asyncio.gather(
                asyncio.to_thread(
                    start,
                    "locks",
                    {
                        "SERENTAK_ETCD_ENDPOINT": etcd.endpoint,
                        "SERENTAK_LOCK_PREFIX": f"/trace-{uuid.uuid4().hex}/",
                    },
                ),
                asyncio.to_thread(
                    start,
                    "notify",
                    {"SERENTAK_NOTIFY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'n.db'}"},
                ),
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
            async with grpc.aio.insecure_channel(upload.address) as channel:
                uploads = upload_pb2_grpc.UploadServiceStub(channel)
                files = upload_pb2_grpc.FileServiceStub(channel)
                alice = (("authorization", "Bearer dev-alice"),)
                # Version 1 and the share with bob: untraced by the client.
                first = await uploads.UploadFile(
                    upload_pb2.UploadFileRequest(
                        new_file=upload_pb2.NewFileTarget(name="shared.bin"), data=b"v1"
                    ),
                    metadata=alice,
                )
                await files.ShareFile(
                    upload_pb2.ShareFileRequest(
                        file_id=first.upload.file_id, user_id="bob", role=upload_pb2.ROLE_VIEWER
                    ),
                    metadata=alice,
                )

                # Version 2, chunked, every call in the client's one trace.
                trace_id = uuid.uuid4().hex
                traced = (*alice, ("traceparent", f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"))
                data = os.urandom(CHUNK * 3)
                up = await uploads.CreateUpload(
                    upload_pb2.CreateUploadRequest(
                        file_id=first.upload.file_id,
                        total_chunks=3,
                        total_size=len(data),
                        chunk_size=CHUNK,
                    ),
                    metadata=traced,
                )
                for i, piece in enumerate(split(data, CHUNK)):
                    await uploads.PutChunk(chunk_request(up.upload_id, i, piece), metadata=traced)
                done = await _completed(uploads, up.upload_id, alice)

            def ours() -> list[ExportedSpan]:
                return [s for s in receiver.spans if s.trace_id == trace_id]

            await receiver.wait_for(lambda _: _whole(ours()), DEADLINE_S)
            # The fan-out ran: bob, who shares the file, has the new version's notification.
            async with grpc.aio.insecure_channel(notify.address) as channel:
                listed = await notify_pb2_grpc.NotifyServiceStub(channel).ListNotifications(
                    notify_pb2.ListNotificationsRequest(),
                    metadata=(("authorization", "Bearer dev-bob"),),
                )
            versions = [n.version for n in listed.notifications if n.file_id == up.file_id]
            assert versions.count(done.file_version) == 1
            spans = ours()
            by_service: dict[str, set[str]] = {}
            for s in spans:
                by_service.setdefault(s.service, set()).add(s.name)
            assert set(by_service) == {"serentak-upload", "serentak-locks", "serentak-notify"}
            upload_names = by_service["serentak-upload"]
            assert {
                f"{UPLOADS}CreateUpload",
                f"{UPLOADS}PutChunk",
                "job upload.merge",
                "upload merge",
                "lock hold",
                "upload commit_version",
            } <= upload_names
            assert upload_names & RELAY
            assert HOLD in by_service["serentak-locks"]
            assert by_service["serentak-notify"] & NOTIFY_INGEST
            assert by_service["serentak-notify"] & NOTIFY_FANOUT

            # The links across processes are parent/child, not only a shared trace id:
            # notify's spans lead back to upload's commit (through the relay's call when
            # the event went alone or first in its batch); locks' Hold is the child of
            # upload's Hold call, under the merge's lock hold.
            by_id = {s.span_id: s for s in spans}

            def ancestors(span: ExportedSpan) -> list[tuple[str, str]]:
                chain = []
                while span.parent_span_id in by_id:
                    span = by_id[span.parent_span_id]
                    chain.append((span.service, span.name))
                return chain

            commit = ("serentak-upload", "upload commit_version")
            merge_job = ("serentak-upload", "job upload.merge")
            for span in spans:
                if span.service == "serentak-notify":
                    assert commit in ancestors(span), (span.name, ancestors(span))
                    assert merge_job in ancestors(span)
            (hold,) = [s for s in spans if s.service == "serentak-locks" and s.name == HOLD]
            assert ancestors(hold)[:2] == [
                ("serentak-upload", HOLD),
                ("serentak-upload", "lock hold"),
            ]
            # The client's traceparent is the root of it all.
            roots = {s.name for s in spans if s.parent_span_id not in by_id}
            assert roots == {f"{UPLOADS}CreateUpload", f"{UPLOADS}PutChunk"}
    finally:
        await receiver.stop()
