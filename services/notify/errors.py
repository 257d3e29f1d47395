"""Typed errors of the notify service (all under `SerentakError`)."""

from __future__ import annotations

from services.common.errors import InvalidArgument, ResourceExhausted


class InvalidCursor(InvalidArgument):
    """A cursor or page token that this service did not hand out."""

    reason = "INVALID_CURSOR"

    def __init__(self, field: str, value: str) -> None:
        super().__init__(field, f"not a cursor: {value[:64]!r}", reason=self.reason)


class InvalidEvent(InvalidArgument):
    """An ingested event missing what the inbox needs (names the event field)."""

    reason = "INVALID_EVENT"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"event.{field}", message, reason=self.reason)


class SubscriberTooSlow(ResourceExhausted):
    """A Subscribe stream whose buffer overflowed; the client resumes from its last cursor."""

    reason = "SUBSCRIBER_TOO_SLOW"

    def __init__(self, buffered: int, last_cursor: str) -> None:
        super().__init__(
            f"stream dropped: {buffered} notifications were waiting; resume from the last cursor",
            reason=self.reason,
            last_cursor=last_cursor,
        )
