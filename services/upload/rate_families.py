"""The upload service's RPC families and their limits (services/common/rate_limits/).

Every RPC a user calls is in one family. Writes cost what they store: each chunk, whether
it comes by PutChunk or as one message of an UploadChunks stream. Sharing has a family of
its own because a share reaches other users (notifications, access). Operator and
service calls (UploadAdminService, AdminService) are not limited: their principals are
services.
"""

from __future__ import annotations

from services.common.rate_limits import FamilyLimits, RatePolicy, Rule
from services.upload.settings import UploadSettings

WRITES, READS, SHARING = "writes", "reads", "sharing"

RULES = {
    # UploadService
    "CreateUpload": Rule(WRITES),
    "PutChunk": Rule(WRITES),
    "UploadChunks": Rule(WRITES, messages=True),
    "AbortUpload": Rule(WRITES),
    "UploadFile": Rule(WRITES),
    "GetUpload": Rule(READS),
    "ListUploads": Rule(READS),
    # FileService
    "CreateFolder": Rule(WRITES),
    "RenameFile": Rule(WRITES),
    "MoveFile": Rule(WRITES),
    "DeleteFile": Rule(WRITES),
    "RestoreFile": Rule(WRITES),
    "GetFile": Rule(READS),
    "ListFolder": Rule(READS),
    "ListCollaborators": Rule(READS),
    "ListSharedWithMe": Rule(READS),
    "Download": Rule(READS),
    "ListVersions": Rule(READS),
    "ListChanges": Rule(READS),
    "RestoreVersion": Rule(WRITES),
    "ShareFile": Rule(SHARING),
    "ShareFileBatch": Rule(SHARING),
    "UnshareFile": Rule(SHARING),
    # SyncService
    "LinkItem": Rule(WRITES),
    "UnlinkItem": Rule(WRITES),
    "LinkDrive": Rule(WRITES),
    "UnlinkDrive": Rule(WRITES),
    "TriggerSync": Rule(WRITES),
    "GetSyncStatus": Rule(READS),
}


def rate_policy(settings: UploadSettings) -> RatePolicy:
    """The upload service's limits as configured in `settings`."""
    return RatePolicy(
        service="upload",
        window_seconds=settings.rate_limit_window_seconds,
        families={
            WRITES: FamilyLimits(
                settings.rate_limit_writes_per_user, settings.rate_limit_writes_per_tenant
            ),
            READS: FamilyLimits(
                settings.rate_limit_reads_per_user, settings.rate_limit_reads_per_tenant
            ),
            SHARING: FamilyLimits(
                settings.rate_limit_sharing_per_user, settings.rate_limit_sharing_per_tenant
            ),
        },
        rules=RULES,
    )
