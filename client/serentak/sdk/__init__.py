"""The Serentak Python SDK: one async client for uploads, files, locks and notifications.

async with SerentakClient("127.0.0.1:50051", token="dev-alice") as client:
    done = await client.upload(Path("movie.bin"), progress=print_progress)
    await client.download(done.file_id, Path("copy.bin"))
"""

from serentak.errors import LockHeld, LockLost
from serentak.sdk.client import ProgressCallback, SerentakClient
from serentak.sdk.locks import HeldLock, LockClient
from serentak.sdk.notifications import notifications_in
from serentak.sdk.results import ChecksumMismatch, DownloadResult, UploadFailed
from serentak.sdk.transfer import upload_request_id

__all__ = [
    "ChecksumMismatch",
    "DownloadResult",
    "HeldLock",
    "LockClient",
    "LockHeld",
    "LockLost",
    "ProgressCallback",
    "SerentakClient",
    "UploadFailed",
    "notifications_in",
    "upload_request_id",
]
