"""What the SDK returns or raises besides the server's own gRPC errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from serentak.sdk.named import Named
from serentak.upload.v1 import upload_pb2


class UploadFailed(Exception):
    """The upload ended without a file version (merge failed, aborted or expired)."""

    def __init__(self, upload: upload_pb2.Upload | Named[upload_pb2.Upload]) -> None:
        self.upload: Named[upload_pb2.Upload] = Named(upload)
        status = self.upload.status
        super().__init__(
            f"upload {upload.upload_id} {status}: {upload.failure_reason or str(status).upper()}"
        )


class ChecksumMismatch(Exception):
    """The bytes received do not hash to the checksum the server sent (nothing was kept)."""


@dataclass(frozen=True)
class DownloadResult:
    """A finished, verified download."""

    path: Path
    size: int
    checksum: str
    checksum_algorithm: str
    # False when the server sent no sha256 to compare against.
    verified: bool


def rpc_reason(exc: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
    """The ErrorInfo reason and metadata of a failed call ("" and {} when absent)."""
    status = rpc_status.from_call(exc)
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason, dict(info.metadata)
    return "", {}
