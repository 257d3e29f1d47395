"""Shape checks for the ids every service accepts from callers, with one set of limits.

A bad id is refused at the API with INVALID_ARGUMENT naming the field, so a database
column (e.g. a `String(64)` on PostgreSQL) or a downstream service is never the first to
say no. Whether a principal *exists* is not checked here: in dev mode the token table is
the only user directory, and production identities come from the identity provider.
"""

from __future__ import annotations

import re

from services.common.errors import InvalidArgument

# User and tenant ids: the widest column that stores them is String(64).
MAX_PRINCIPAL_LENGTH = 64
# Resource ids (files, folders, uploads): ours are 32 hex characters; 64 leaves room.
MAX_ID_LENGTH = 64
MAX_CLIENT_REQUEST_ID_LENGTH = 128

# No ':' (ids are joined with ':' into keys), no '/', no spaces or control characters.
_PRINCIPAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+|-]*")
_RESOURCE_ID = re.compile(r"[A-Za-z0-9_-]+")


def principal_id(value: str, field: str) -> str:
    """`value` if it is a well-formed user or tenant id; else INVALID_ARGUMENT naming `field`."""
    if not value:
        raise InvalidArgument(field, "must not be empty", reason="INVALID_PRINCIPAL")
    if len(value) > MAX_PRINCIPAL_LENGTH:
        raise InvalidArgument(
            field, f"longer than {MAX_PRINCIPAL_LENGTH} characters", reason="INVALID_PRINCIPAL"
        )
    if not _PRINCIPAL.fullmatch(value):
        raise InvalidArgument(
            field,
            "must be ASCII letters, digits and . _ @ + | - (starting with a letter or digit)",
            reason="INVALID_PRINCIPAL",
        )
    return value


def resource_id(value: str, field: str, *, required: bool = True) -> str:
    """`value` if it is a well-formed resource id ("" allowed when not `required`)."""
    if not value:
        if required:
            raise InvalidArgument(field, "must not be empty", reason="INVALID_ID")
        return value
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(field, f"longer than {MAX_ID_LENGTH} characters", reason="INVALID_ID")
    if not _RESOURCE_ID.fullmatch(value):
        raise InvalidArgument(field, "must be ASCII letters, digits, _ or -", reason="INVALID_ID")
    return value


def client_request_id(value: str, field: str = "client_request_id") -> str:
    """`value` ("" = none) if it is at most 128 printable characters."""
    if len(value) > MAX_CLIENT_REQUEST_ID_LENGTH or (value and not value.isprintable()):
        raise InvalidArgument(
            field,
            f"at most {MAX_CLIENT_REQUEST_ID_LENGTH} printable characters",
            reason="INVALID_CLIENT_REQUEST_ID",
        )
    return value
