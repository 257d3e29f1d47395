"""Cursors: a user's notification stream position, handed out as an opaque string.

A cursor is the notification's per-user sequence number `seq`. Sequence numbers grow
strictly per user in commit order (see `models.UserStream`), so "everything after
cursor c" is a plain `seq > c` and a resumed stream has neither gap nor duplicate.
"""

from __future__ import annotations

from services.notify.errors import InvalidCursor

_MAX_DIGITS = 18


def encode(seq: int) -> str:
    """The cursor string for sequence number `seq`."""
    return str(seq)


def decode(field: str, cursor: str) -> int:
    """The sequence number in `cursor`; INVALID_ARGUMENT (INVALID_CURSOR) naming `field`."""
    if not cursor.isascii() or not cursor.isdigit() or len(cursor) > _MAX_DIGITS:
        raise InvalidCursor(field, cursor)
    return int(cursor)
