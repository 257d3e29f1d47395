"""The conventional gRPC server metrics (grpc_server_started_total, grpc_server_handled_total
with the final code, grpc_server_handling_seconds), the byte counters of uploads and downloads
and serentak_build_info, each moved by real calls on the upload service (both databases)."""

from __future__ import annotations

import os
from importlib import metadata

import grpc
import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import chunk_request, create_request, download, split, wait_status

UPLOAD = "serentak.upload.v1.UploadService"
FILES = "serentak.upload.v1.FileService"
CHUNK = 64 * 1024


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _handled(service: str, method: str, rpc_type: str, code: str) -> float:
    return _value(
        "grpc_server_handled_total",
        grpc_service=service,
        grpc_method=method,
        grpc_type=rpc_type,
        grpc_code=code,
    )


def _started(service: str, method: str, rpc_type: str) -> float:
    labels = {"grpc_service": service, "grpc_method": method, "grpc_type": rpc_type}
    return _value("grpc_server_started_total", **labels)


def _timed(service: str, method: str, rpc_type: str) -> float:
    labels = {"grpc_service": service, "grpc_method": method, "grpc_type": rpc_type}
    return _value("grpc_server_handling_seconds_count", **labels)


async def test_rpc_and_byte_metrics_move(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(2 * CHUNK + 100)
    before = {
        "created": _handled(UPLOAD, "CreateUpload", "unary", "OK"),
        "started": _started(UPLOAD, "CreateUpload", "unary"),
        "timed": _timed(UPLOAD, "CreateUpload", "unary"),
        "streamed": _handled(UPLOAD, "UploadChunks", "client_stream", "OK"),
        "downloads": _handled(FILES, "Download", "server_stream", "OK"),
        "not_found": _handled(FILES, "GetFile", "unary", "NOT_FOUND"),
        "anonymous": _handled(FILES, "ListFolder", "unary", "UNAUTHENTICATED"),
        "received": _value("serentak_upload_bytes_received_total"),
        "sent": _value("serentak_download_bytes_sent_total"),
    }

    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.md())
    chunks = [chunk_request(upload.upload_id, i, c) for i, c in enumerate(split(data, CHUNK))]
    # The last chunk by the client stream, the others unary; one repeat counts its bytes too.
    for request in [*chunks[:-1], chunks[0]]:
        await alice.uploads.PutChunk(request, metadata=alice.md())
    await alice.uploads.UploadChunks(iter(chunks[-1:]), metadata=alice.md())
    done = await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    body, _ = await download(alice, done.file_id)
    assert body == data
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await alice.files.GetFile(upload_pb2.GetFileRequest(file_id="f" * 32), metadata=alice.md())
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await alice.files.ListFolder(upload_pb2.ListFolderRequest())
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED

    assert _handled(UPLOAD, "CreateUpload", "unary", "OK") == before["created"] + 1
    assert _started(UPLOAD, "CreateUpload", "unary") == before["started"] + 1
    assert _timed(UPLOAD, "CreateUpload", "unary") == before["timed"] + 1
    assert _handled(UPLOAD, "UploadChunks", "client_stream", "OK") == before["streamed"] + 1
    assert _handled(FILES, "Download", "server_stream", "OK") == before["downloads"] + 1
    assert _handled(FILES, "GetFile", "unary", "NOT_FOUND") == before["not_found"] + 1
    assert _handled(FILES, "ListFolder", "unary", "UNAUTHENTICATED") == before["anonymous"] + 1
    received = _value("serentak_upload_bytes_received_total") - before["received"]
    assert received == len(data) + CHUNK
    assert _value("serentak_download_bytes_sent_total") - before["sent"] == len(data)
    # The old names are gone.
    assert REGISTRY.get_sample_value("serentak_rpc_requests_total", {}) is None


def test_build_info_names_the_running_version() -> None:
    version = metadata.version("serentak")
    samples = [s for m in REGISTRY.collect() if m.name == "serentak_build_info" for s in m.samples]
    assert [s.labels["version"] for s in samples] == [version]
    assert samples[0].value == 1
    assert samples[0].labels["grpc_version"] == grpc.__version__
