"""The tus 1.0 protocol's words: versions, extensions, headers, and parsing of what
clients send (no I/O). Text: github.com/tus/tus-resumable-upload-protocol, protocol.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime

TUS_VERSION = "1.0.0"
EXTENSIONS = (
    "creation",
    "creation-with-upload",
    "creation-defer-length",
    "checksum",
    "termination",
    "expiration",
    "concatenation",
)
# sha1 is the one every server must support; the others are what hashlib always has.
CHECKSUM_ALGORITHMS = ("sha1", "sha256", "sha512", "md5")
OFFSET_CONTENT_TYPE = "application/offset+octet-stream"
# "Tus-Checksum-Algorithm" and the rest, as a browser must be allowed to read them.
EXPOSED_HEADERS = (
    "Location",
    "Tus-Resumable",
    "Tus-Version",
    "Tus-Extension",
    "Tus-Max-Size",
    "Tus-Checksum-Algorithm",
    "Upload-Offset",
    "Upload-Length",
    "Upload-Defer-Length",
    "Upload-Metadata",
    "Upload-Expires",
    "Upload-Concat",
    "Serentak-Upload-Id",
    "Serentak-File-Id",
    "Serentak-Upload-Status",
    "Serentak-Error-Reason",
    "X-Correlation-Id",
)
ALLOWED_HEADERS = (
    "Authorization",
    "Content-Type",
    "Tus-Resumable",
    "Upload-Offset",
    "Upload-Length",
    "Upload-Defer-Length",
    "Upload-Metadata",
    "Upload-Checksum",
    "Upload-Concat",
    "X-HTTP-Method-Override",
    "X-Requested-With",
    "X-Correlation-Id",
    "traceparent",
    "tracestate",
)
ALLOWED_METHODS = ("POST", "HEAD", "PATCH", "DELETE", "OPTIONS")
# Upload-Metadata bounds: a header, not a payload.
MAX_METADATA_CHARS = 4096
# 460 is tus's own status; aiohttp has no reason phrase for it.
CHECKSUM_MISMATCH = 460

SINGLE, PARTIAL, FINAL = "single", "partial", "final"


class TusError(Exception):
    """A refusal with its HTTP status (the spec's where it names one) and a reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def non_negative(value: str | None, header: str) -> int | None:
    """A header that must hold a non-negative integer (None when absent); 400 otherwise."""
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        raise TusError(400, "INVALID_HEADER", f"{header} must be a non-negative integer")
    return int(text)


def parse_metadata(value: str | None) -> dict[str, str]:
    """Upload-Metadata: comma-separated `key base64value` pairs (value optional), unique
    keys; values decoded as UTF-8. 400 on anything else."""
    if not value:
        return {}
    if len(value) > MAX_METADATA_CHARS:
        raise TusError(400, "INVALID_METADATA", f"Upload-Metadata is over {MAX_METADATA_CHARS}")
    found: dict[str, str] = {}
    for pair in value.split(","):
        key, _, encoded = pair.strip().partition(" ")
        if not key or key in found or any(c.isspace() for c in key):
            raise TusError(400, "INVALID_METADATA", f"Upload-Metadata key {key!r} is invalid")
        try:
            found[key] = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise TusError(
                400, "INVALID_METADATA", f"Upload-Metadata value of {key!r} is not base64 UTF-8"
            ) from None
    return found


@dataclass(frozen=True, slots=True)
class Checksum:
    """An Upload-Checksum header: the algorithm and the digest it claims."""

    algorithm: str
    digest: bytes

    def hasher(self) -> hashlib._Hash:
        """A fresh hasher of the algorithm."""
        return hashlib.new(self.algorithm)


def parse_checksum(value: str | None) -> Checksum | None:
    """Upload-Checksum `algorithm base64digest`: 400 for an unknown algorithm or a bad
    header (the spec's status for an unsupported algorithm)."""
    if value is None:
        return None
    algorithm, _, encoded = value.strip().partition(" ")
    if algorithm not in CHECKSUM_ALGORITHMS:
        raise TusError(
            400,
            "CHECKSUM_ALGORITHM_UNSUPPORTED",
            f"checksum algorithm {algorithm!r} is not one of {','.join(CHECKSUM_ALGORITHMS)}",
        )
    try:
        digest = base64.b64decode(encoded.strip(), validate=True)
    except binascii.Error:
        raise TusError(400, "INVALID_CHECKSUM", "Upload-Checksum digest is not base64") from None
    if len(digest) != hashlib.new(algorithm).digest_size:
        raise TusError(400, "INVALID_CHECKSUM", f"Upload-Checksum is not a {algorithm} digest")
    return Checksum(algorithm, digest)


def parse_concat(value: str | None, base_path: str) -> tuple[str, list[str]]:
    """Upload-Concat: (`single`, []), (`partial`, []) or (`final`, [the partials' ids]).

    A final's URLs may be absolute or relative; each must end in `{base_path}{id}`."""
    if value is None:
        return SINGLE, []
    text = value.strip()
    if text == PARTIAL:
        return PARTIAL, []
    kind, sep, urls = text.partition(";")
    if kind != FINAL or not sep or not urls.split():
        raise TusError(400, "INVALID_CONCAT", "Upload-Concat must be partial or final;URL ...")
    ids = []
    for url in urls.split():
        path = url.split("?", 1)[0]
        _, sep, upload_id = path.rpartition(base_path)
        if not sep or not upload_id or "/" in upload_id:
            raise TusError(400, "INVALID_CONCAT", f"{url!r} is not an upload of this endpoint")
        ids.append(upload_id)
    return FINAL, ids


def http_date(moment: datetime) -> str:
    """RFC 9110 IMF-fixdate (Upload-Expires)."""
    return format_datetime(moment, usegmt=True)
