"""Typed errors of the upload service, each with its gRPC code and ErrorInfo reason."""

from __future__ import annotations

from services.common.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)


class ChecksumMismatch(InvalidArgument):
    """The chunk's bytes do not hash to the checksum the client sent."""

    reason = "CHECKSUM_MISMATCH"


class ChunkConflict(AlreadyExists):
    """The index is already stored with another checksum or size; the stored chunk stays."""

    reason = "CHUNK_CONFLICT"


class UploadNotFound(NotFound):
    reason = "UPLOAD_NOT_FOUND"


class FileNotFound(NotFound):
    reason = "FILE_NOT_FOUND"


class UploadNotActive(FailedPrecondition):
    """The upload is no longer `uploading` (merging, completed, failed, aborted, expired)."""

    reason = "UPLOAD_NOT_ACTIVE"


class StaleFencingToken(Aborted):
    """A commit carried a lock token lower than the file's `last_lock_token`."""

    reason = "STALE_FENCING_TOKEN"


class VersionMismatch(Aborted):
    """The request's `expected_version` is not the file's current version."""

    reason = "VERSION_MISMATCH"


class NotAllowed(PermissionDenied):
    """The caller may see the file but not make this change."""

    reason = "INSUFFICIENT_ROLE"


class WrongKind(FailedPrecondition):
    """A folder where a file is needed, or the reverse."""

    reason = "WRONG_FILE_KIND"


class FileDeleted(FailedPrecondition):
    reason = "FILE_DELETED"


class UploaderNotAllowed(PermissionDenied):
    """The upload's creator may no longer write its file or folder (unshared, moved away)."""

    reason = "UPLOADER_NOT_ALLOWED"


class BlobStoreUnavailable(Unavailable):
    """The object store (S3-compatible) failed or could not be reached; retry later."""

    reason = "BLOB_STORE_UNAVAILABLE"


class UploadTooLarge(ResourceExhausted):
    """The upload would make a file larger than `max_upload_bytes`."""

    reason = "UPLOAD_TOO_LARGE"


class QuotaExceeded(ResourceExhausted):
    """The tenant's stored bytes plus open uploads would pass `tenant_quota_bytes`."""

    reason = "QUOTA_EXCEEDED"


class TooManyUploads(ResourceExhausted):
    """The user already has `max_open_uploads_per_user` uploads uploading or merging."""

    reason = "TOO_MANY_UPLOADS"


class TooManyWaiters(ResourceExhausted):
    """This replica already has `upload_wait_max_waiters` GetUpload calls waiting."""

    reason = "UPLOAD_WAITER_LIMIT"


class TooManyChangeWaiters(ResourceExhausted):
    """This replica already has `change_wait_max_waiters` ListChanges calls waiting."""

    reason = "CHANGE_WAITER_LIMIT"


class ContentReplaced(Aborted):
    """The version a download was reading was replaced and deleted: download again."""

    reason = "CONTENT_REPLACED"


class UploadFailed(FailedPrecondition):
    """The upload ended `failed` (its merge refused or could not make the file); the
    reason is in `failure_reason` (GetUpload)."""

    reason = "UPLOAD_FAILED"


class MergePending(Unavailable):
    """The upload's merge is running elsewhere or was handed to the job runtime (a lock
    wait that timed out, a lost lease): it completes without the caller. Retry the same
    request (same client_request_id) or wait with GetUpload."""

    reason = "MERGE_PENDING"


class VersionNotFound(NotFound):
    """The file never had this content version (ListVersions lists the ones it had)."""

    reason = "VERSION_NOT_FOUND"


class VersionPurged(FailedPrecondition):
    """The content version existed, but the retention policy deleted its bytes."""

    reason = "VERSION_PURGED"


class VersionIsCurrent(FailedPrecondition):
    """RestoreVersion of the content the file already has: nothing to restore."""

    reason = "VERSION_IS_CURRENT"


class CursorExpired(FailedPrecondition):
    """A ListChanges cursor older than the change log's retention: enumerate again."""

    reason = "CURSOR_EXPIRED"
