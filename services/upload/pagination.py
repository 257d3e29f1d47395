"""Page sizes of the upload service's listings (tokens: `services.common.page_tokens`)."""

from __future__ import annotations

from services.common.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(value: int, field: str = "page_size") -> int:
    """The page size to use: default for 0, INVALID_ARGUMENT when negative, capped at max."""
    if value < 0:
        raise InvalidArgument(field, "must not be negative")
    return min(value or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
