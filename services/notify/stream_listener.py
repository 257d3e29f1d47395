"""Cross-replica live delivery on PostgreSQL: LISTEN for stream positions, wake streams.

Migration notify_0005 NOTIFYs `serentak_notify_streams` with the stream positions a
statement moved, `[[tenant_id, user_id, seq], ...]` (notify_0003's row triggers sent one
`[tenant_id, user_id, seq]` each: still read, for a replica on the older schema). Every
notify replica holds one listening connection and turns each position into `Broker.wake`:
that user's streams on this replica read the database after their cursor (`streams.py`
explains why this has neither gap nor duplicate). On (re)connect every stream is woken
once, for whatever was committed while nobody listened.
"""

from __future__ import annotations

import json

from sqlalchemy.engine import URL

from services.common.jobs.listener import CommitListener
from services.common.logging import get_logger
from services.notify.streams import Broker

log = get_logger(__name__)

STREAMS_CHANNEL = "serentak_notify_streams"


def _position(item: object) -> tuple[str, str, int] | None:
    if not isinstance(item, list) or len(item) != 3:
        return None
    tenant_id, user_id, seq = item
    if not isinstance(tenant_id, str) or not isinstance(user_id, str) or type(seq) is not int:
        return None
    return tenant_id, user_id, seq


def parse_positions(payload: str) -> list[tuple[str, str, int]] | None:
    """The (tenant_id, user_id, seq) positions of a NOTIFY payload: a list of them, or one
    alone (notify_0003's form); None when it is neither."""
    try:
        items = json.loads(payload)
    except ValueError:
        return None
    single = _position(items)
    if single is not None:
        return [single]
    if not isinstance(items, list) or not items:
        return None
    positions: list[tuple[str, str, int]] = []
    for item in items:
        # `_position` inlined (a NOTIFY carries a position per recipient): json.loads
        # makes exact lists, strs and ints, so `type(...) is` checks what isinstance did.
        if type(item) is list and len(item) == 3:
            tenant_id, user_id, seq = item
            if type(tenant_id) is str and type(user_id) is str and type(seq) is int:
                positions.append((tenant_id, user_id, seq))
                continue
        return None
    return positions


def stream_listener(url: URL, broker: Broker) -> CommitListener:
    """The listener that wakes `broker`'s streams on other replicas' (and own) commits."""

    def on_position(payload: str) -> None:
        positions = parse_positions(payload)
        if positions is None:
            # Not ours to guess: waking everyone is always safe.
            log.warning("stream_notify_unparsable", payload=payload[:200])
            broker.wake_all()
            return
        broker.wake_many(positions)

    return CommitListener(
        url, {STREAMS_CHANNEL: broker.wake_all}, payloads={STREAMS_CHANNEL: on_position}
    )
