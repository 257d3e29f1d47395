"""The Serentak Python SDK: one async client for uploads, files, locks and notifications.

async with SerentakClient("127.0.0.1:50051", token="dev-alice") as client:
    done = await client.upload(Path("movie.bin"), progress=print_progress)
    await client.download(done.file_id, Path("copy.bin"))
    print(done.status)  # completed: enum fields read as names (serentak.sdk.named)
"""

from serentak.errors import LockHeld, LockLost
from serentak.sdk.client import ProgressCallback, SerentakClient
from serentak.sdk.locks import HeldLock, LockClient
from serentak.sdk.named import (
    ChangeKind,
    ChecksumAlgorithm,
    FileKind,
    Named,
    ProtoEnum,
    Role,
    UploadStatus,
)
from serentak.sdk.notifications import notifications_in
from serentak.sdk.results import ChecksumMismatch, DownloadResult, UploadFailed
from serentak.sdk.transfer import upload_request_id

__all__ = [
    "ChangeKind",
    "ChecksumAlgorithm",
    "ChecksumMismatch",
    "DownloadResult",
    "FileKind",
    "HeldLock",
    "LockClient",
    "LockHeld",
    "LockLost",
    "Named",
    "ProgressCallback",
    "ProtoEnum",
    "Role",
    "SerentakClient",
    "UploadFailed",
    "UploadStatus",
    "notifications_in",
    "upload_request_id",
]
