"""Typed errors of the sync engine, each with its gRPC code and ErrorInfo reason."""

from __future__ import annotations

from services.common.errors import FailedPrecondition, NotFound


class FileRetentionExpired(FailedPrecondition):
    """The file's upstream copy is gone for good (410, removed or past retention)."""

    reason = "FILE_RETENTION_EXPIRED"


class SyncedItemNotFound(NotFound):
    reason = "SYNCED_ITEM_NOT_FOUND"


class LinkedDriveNotFound(NotFound):
    reason = "LINKED_DRIVE_NOT_FOUND"


class SyncProviderNotConfigured(FailedPrecondition):
    """The caller's tenant has no provider credential: a link could only fail upstream."""

    reason = "SYNC_PROVIDER_NOT_CONFIGURED"
