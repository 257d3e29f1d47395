"""UploadFile on two replicas of one database: the same request (its client_request_id)
sent to both at once makes one upload and one version, of a new file or of one shared.
Each replica commits its small files in groups whose upload rows are written at the
group's end, so the loser may learn of the other's row from the unique index only then;
it answers with the winner's upload."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from sqlalchemy import select
from support.services import running_app
from upload.conftest import TOKENS
from upload.upload_helpers import sha256
from upload.version_helpers import content_events

from services.upload.app import build_app as build_upload_app
from services.upload.models import UploadRow

REQUESTS = 24


async def test_one_request_sent_to_two_replicas_commits_once(
    cluster, sessions, runtime_options, sync_settings
) -> None:
    settings = cluster.settings
    # A second replica: the same database and blob store, a job runtime of its own.
    second = dataclasses.replace(runtime_options, node_id=f"{runtime_options.node_id}-b")
    other = build_upload_app(settings, second, sync_settings)
    metadata = (("authorization", f"Bearer {TOKENS['alice']}"),)
    async with running_app(other) as service:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.app.bound_port}")
        replicas = [cluster["alice"].uploads, upload_pb2_grpc.UploadServiceStub(channel)]
        sources = {
            f"dup-{n}-{uuid.uuid4().hex[:6]}": bytes([n]) * (100 + n) for n in range(REQUESTS)
        }

        shared = await replicas[0].UploadFile(
            upload_pb2.UploadFileRequest(
                new_file=upload_pb2.NewFileTarget(name="shared.bin"), data=b"v1"
            ),
            metadata=metadata,
        )

        async def both(crid: str, data: bytes) -> list[upload_pb2.UploadFileResponse]:
            # Half new files (the name check finds the other's), half new versions of one
            # file (no name to check: the request id's unique index decides).
            request = upload_pb2.UploadFileRequest(client_request_id=crid, data=data)
            if data[0] % 2:
                request.file_id = shared.file.file_id
            else:
                request.new_file.name = f"{crid}.bin"
            return list(
                await asyncio.gather(
                    *(stub.UploadFile(request, metadata=metadata) for stub in replicas)
                )
            )

        try:
            answers = await asyncio.gather(*(both(c, d) for c, d in sources.items()))
        finally:
            await channel.close()
    versions = []
    for data, (first, second) in zip(sources.values(), answers, strict=True):
        assert first.upload == second.upload
        assert (first.file.file_id, first.file.version) == (
            second.file.file_id,
            second.file.version,
        )
        assert first.upload.final_checksum == sha256(data)
        if first.file.file_id == shared.file.file_id:
            versions.append(first.file.version)
    assert sorted(versions) == list(range(2, 2 + REQUESTS // 2))  # each request once
    async with sessions() as session:
        stored = (
            await session.execute(
                select(UploadRow.client_request_id).where(
                    UploadRow.client_request_id.in_(list(sources))
                )
            )
        ).all()
    assert sorted(c for (c,) in stored) == sorted(sources)  # one upload each
    uploads = {first.upload.upload_id for first, _ in answers}
    events = await content_events(settings.database_url)
    assert sorted(
        e.file_content_updated.upload_id
        for e in events
        if e.file_content_updated.upload_id in uploads
    ) == sorted(uploads)  # one version, one event each
