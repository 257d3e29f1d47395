"""Cross-replica live delivery on PostgreSQL: LISTEN for stream positions, wake streams.

Migration notify_0003 NOTIFYs `serentak_notify_streams` with `[tenant_id, user_id, seq]`
whenever a user's stream position moves (at commit). Every notify replica holds one
listening connection and turns each notification into `Broker.wake`: that user's streams
on this replica read the database after their cursor (`streams.py` explains why this has
neither gap nor duplicate). On (re)connect every stream is woken once, for whatever was
committed while nobody listened.
"""

from __future__ import annotations

import json

from sqlalchemy.engine import URL

from services.common.jobs.listener import CommitListener
from services.common.logging import get_logger
from services.notify.streams import Broker

log = get_logger(__name__)

STREAMS_CHANNEL = "serentak_notify_streams"


def parse_position(payload: str) -> tuple[str, str, int] | None:
    """(tenant_id, user_id, seq) from a NOTIFY payload; None when it is not one."""
    try:
        tenant_id, user_id, seq = json.loads(payload)
    except (ValueError, TypeError):
        return None
    if not isinstance(tenant_id, str) or not isinstance(user_id, str) or not isinstance(seq, int):
        return None
    return tenant_id, user_id, seq


def stream_listener(url: URL, broker: Broker) -> CommitListener:
    """The listener that wakes `broker`'s streams on other replicas' (and own) commits."""

    def on_position(payload: str) -> None:
        position = parse_position(payload)
        if position is None:
            # Not ours to guess: waking everyone is always safe.
            log.warning("stream_notify_unparsable", payload=payload[:200])
            broker.wake_all()
            return
        broker.wake(*position)

    return CommitListener(
        url, {STREAMS_CHANNEL: broker.wake_all}, payloads={STREAMS_CHANNEL: on_position}
    )
