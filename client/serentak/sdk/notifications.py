"""Reading Subscribe messages, whichever shape the stream was opened with."""

from __future__ import annotations

from collections.abc import Sequence

from serentak.notify.v1 import notify_pb2


def notifications_in(
    message: notify_pb2.SubscribeResponse,
) -> Sequence[notify_pb2.Notification]:
    """The notifications a Subscribe message carries, in cursor order: one in
    `notification`, or a batching stream's `notifications`; none in the "now" marker."""
    if message.HasField("notification"):
        return [message.notification]
    return message.notifications
