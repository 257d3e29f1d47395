"""Opaque page tokens: a keyset position encoded so clients cannot depend on its form."""

from __future__ import annotations

import base64
import json

from services.common.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(value: int, field: str = "page_size") -> int:
    """The page size to use: default for 0, INVALID_ARGUMENT when negative, capped at max."""
    if value < 0:
        raise InvalidArgument(field, "must not be negative")
    return min(value or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def encode(position: list[str | int]) -> str:
    """A token for the keyset `position` (the last row's sort key)."""
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode()


def decode(token: str, arity: int, field: str = "page_token") -> list[str | int] | None:
    """The keyset position in `token` (None when empty); INVALID_ARGUMENT if malformed."""
    if not token:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, UnicodeError):
        raise InvalidArgument(field, "is not a token this service issued") from None
    if not isinstance(value, list) or len(value) != arity:
        raise InvalidArgument(field, "is not a token this service issued")
    return value
