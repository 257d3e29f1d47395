"""S3 failures as the one error callers know: `BlobStoreUnavailable` (UNAVAILABLE, retry)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from obstore.exceptions import BaseError

from services.common.logging import get_logger
from services.upload import metrics
from services.upload.errors import BlobStoreUnavailable
from services.upload.storage.blob_store.s3_multipart import S3RequestFailed

log = get_logger(__name__)

# obstore (rustls) names the reason deep in its debug text; httpx (OpenSSL) in its message.
_REFUSED = re.compile(
    r"InvalidCertificate\(\s*(\w+)|certificate verify failed: ([^(]+?)\s*\(", re.IGNORECASE
)


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
        refused = untrusted_certificate(exc)
        log.warning(
            "blob_store_error",
            operation=operation,
            key=key,
            error=first_line(exc),
            **({"tls": refused} if refused else {}),
        )
        raise BlobStoreUnavailable(
            f"the object store failed to {operation} a blob; retry later", operation=operation
        ) from exc


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (at most 300 characters), for a log field."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def untrusted_certificate(exc: BaseException) -> str | None:
    """When the store's TLS certificate was refused: why, and the setting that helps (the
    first line of obstore's error says only "error sending request"); else None."""
    found = _REFUSED.search(str(exc))
    if found is None:
        return None
    reason = found.group(1) or found.group(2)
    return (
        f"the store's TLS certificate was refused ({reason}); if a private CA signed it, "
        "set SERENTAK_S3_CA_FILE to that CA"
    )
