"""AuditUploads and `serentak audit`: a healthy store (small files stored whole included)
reports healthy; a corrupted merged
blob, a lost chunk row and a wrong received count are each reported; only the service
credential may ask."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
from serentak.cli import main
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from sqlalchemy import delete, update
from upload.upload_helpers import (
    chunk_request,
    create_request,
    expect_error,
    split,
    upload_completed,
)

from services.common.db import create_engine, session_factory
from services.upload.models import ChunkRow, UploadRow
from services.upload.storage.blob_store import content_key

CHUNK = 1024
SERVICE = (("authorization", "Bearer dev-ops"),)  # AuditUploads needs the ops role


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_audit_reports_corruption_and_count_drift(cluster, capsys) -> None:
    alice = cluster["alice"]
    admin = upload_pb2_grpc.UploadAdminServiceStub(cluster.channel)
    a = await upload_completed(alice, os.urandom(CHUNK * 2 + 3), CHUNK, name="a.bin")
    b = await upload_completed(alice, os.urandom(CHUNK * 2), CHUNK, name="b.bin")
    partial = os.urandom(CHUNK * 3)
    open_upload = await alice.uploads.CreateUpload(
        create_request(partial, CHUNK, name="partial.bin"), metadata=alice.metadata
    )
    for i in (0, 2):
        await alice.uploads.PutChunk(
            chunk_request(open_upload.upload_id, i, split(partial, CHUNK)[i]),
            metadata=alice.metadata,
        )

    # A small file stored whole (UploadFile: no chunk row) is healthy too.
    whole = await alice.uploads.UploadFile(
        upload_pb2.UploadFileRequest(
            new_file=upload_pb2.NewFileTarget(name="whole.bin"), data=os.urandom(CHUNK)
        ),
        metadata=alice.metadata,
    )

    clean = await admin.AuditUploads(
        upload_pb2.AuditUploadsRequest(sample_size=10), metadata=SERVICE
    )
    assert clean.healthy
    assert not clean.duplicate_chunks and not clean.count_mismatches
    assert {c.file_id for c in clean.checksum_checks} == {a.file_id, b.file_id, whole.file.file_id}
    assert all(c.ok and c.actual_checksum == c.recorded_checksum for c in clean.checksum_checks)
    [missing] = clean.missing_chunks
    assert missing.upload_id == open_upload.upload_id
    assert [(r.start, r.end) for r in missing.missing_ranges] == [(1, 2)]

    # Bit rot in a's merged blob; b loses a chunk row; the open upload's count drifts.
    merged = content_key(a.file_id, a.upload_id)
    raw = await cluster.blobs.read(merged)
    await cluster.blobs.publish(
        await cluster.blobs.stage(merged, bytes([raw[0] ^ 0x01]) + raw[1:]), merged
    )
    engine = create_engine(cluster.settings.database_url)
    try:
        async with session_factory(engine).begin() as session:
            await session.execute(
                delete(ChunkRow).where(ChunkRow.upload_id == b.upload_id, ChunkRow.chunk_index == 1)
            )
            await session.execute(
                update(UploadRow)
                .where(UploadRow.id == open_upload.upload_id)
                .values(received_chunk_count=3)
            )
    finally:
        await engine.dispose()

    report = await admin.AuditUploads(
        upload_pb2.AuditUploadsRequest(sample_size=10), metadata=SERVICE
    )
    assert not report.healthy
    checks = {c.file_id: c for c in report.checksum_checks}
    assert not checks[a.file_id].ok
    assert checks[a.file_id].actual_checksum != checks[a.file_id].recorded_checksum
    assert checks[b.file_id].ok
    drift = {
        (m.upload_id, m.distinct_stored_chunks, m.received_chunk_count, m.total_chunks)
        for m in report.count_mismatches
    }
    assert drift == {(b.upload_id, 1, 2, 2), (open_upload.upload_id, 2, 3, 3)}

    base = ["--address", cluster.address, "--token", "dev-ops"]
    assert await asyncio.to_thread(main, [*base, "audit", "--sample", "10"]) == 1
    out = capsys.readouterr().out
    assert "UNHEALTHY" in out and a.file_id in out and b.upload_id in out


async def test_audit_needs_the_ops_role_and_sane_arguments(cluster) -> None:
    admin = upload_pb2_grpc.UploadAdminServiceStub(cluster.channel)
    await expect_error(
        admin.AuditUploads(upload_pb2.AuditUploadsRequest(), metadata=cluster["alice"].metadata),
        grpc.StatusCode.PERMISSION_DENIED,
        "OPS_ROLE_REQUIRED",
    )
    # Another service principal is not an operator either.
    await expect_error(
        admin.AuditUploads(
            upload_pb2.AuditUploadsRequest(),
            metadata=(("authorization", "Bearer dev-service-notify"),),
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "OPS_ROLE_REQUIRED",
    )
    info = await expect_error(
        admin.AuditUploads(upload_pb2.AuditUploadsRequest(sample_size=-1), metadata=SERVICE),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    assert info.metadata["field"] == "sample_size"
