"""S3 failures as the one error callers know: `BlobStoreUnavailable` (UNAVAILABLE, retry)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from obstore.exceptions import BaseError

from services.common.logging import get_logger
from services.upload import metrics
from services.upload.errors import BlobStoreUnavailable
from services.upload.storage.blob_store.s3_multipart import S3RequestFailed

log = get_logger(__name__)


@contextlib.contextmanager
def store_errors(operation: str, key: str) -> Iterator[None]:
    """obstore's and the multipart calls' failures as BlobStoreUnavailable
    (FileNotFoundError passes through)."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (BaseError, OSError, S3RequestFailed) as exc:
        # The detail (endpoint, bucket, server answer) is for the operator's log, not for
        # the caller, who only needs to know to retry.
        metrics.BLOB_STORE_ERRORS.labels(operation).inc()
        log.warning("blob_store_error", operation=operation, key=key, error=first_line(exc))
        raise BlobStoreUnavailable(
            f"the object store failed to {operation} a blob; retry later", operation=operation
        ) from exc


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (at most 300 characters), for a log field."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
