"""List pagination: page sizes and the opaque page token.

The token names the last lock of the previous page and the prefix it was listed with
(base64url JSON). It carries no tenant: it is only ever applied inside the caller's own
key space, so a token from another tenant's listing reveals and reaches nothing.
"""

from __future__ import annotations

import base64
import binascii
import json

from services.common.errors import InvalidArgument

_VERSION = 1


def page_size(requested: int, legacy_limit: int, default: int, maximum: int) -> int:
    """`page_size`, else the old `limit`, else the default; never above the maximum."""
    for field, value in (("page_size", requested), ("limit", legacy_limit)):
        if value < 0:
            raise InvalidArgument(field, "must not be negative")
    return min(requested or legacy_limit or default, maximum)


def encode_token(after: str, prefix: str) -> str:
    """The next_page_token continuing after lock `after` for List(prefix)."""
    raw = json.dumps({"v": _VERSION, "after": after, "prefix": prefix}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str, prefix: str) -> str | None:
    """The lock to continue after (None for an empty token); INVALID_ARGUMENT if bad."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        after, token_prefix = data["after"], data["prefix"]
        valid = data.get("v") == _VERSION and isinstance(after, str) and after
    except (binascii.Error, ValueError, TypeError, KeyError):
        valid = False
    if not valid:
        raise InvalidArgument("page_token", "is not a token from List", reason="INVALID_PAGE_TOKEN")
    if token_prefix != prefix or not after.startswith(prefix):
        raise InvalidArgument(
            "page_token", "was issued for another prefix", reason="INVALID_PAGE_TOKEN"
        )
    return str(after)
