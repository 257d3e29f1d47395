"""The outbox relay's write transactions: what each one does under the relay's leases.

`relay.py` runs each as a transaction of its own or as a unit of a group commit (its
module docstring, "Write transactions"), so each is written to be the same when run again:
leases taken anew with fresh tokens, marks and releases idempotent.
"""

from __future__ import annotations

from serentak.events.v1 import events_pb2
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.outbox import leases
from services.common.outbox.dead_letters import dead_letter_event
from services.common.outbox.store import (
    OutboxEvent,
    mark_many_published,
    unpublished_events_of,
)


async def take_round(
    session: AsyncSession,
    due: dict[str, tuple[str, str]],
    holder: str,
    lease_seconds: float,
    limit: int,
) -> tuple[dict[str, str], list[tuple[str, str, OutboxEvent]]]:
    """Take the leases of the `due` aggregates (key: (type, id)) that are free and read
    their first `limit` unpublished events: ({key: token} taken, the events read)."""
    held = await leases.acquire_many(session, list(due), holder, lease_seconds)
    return held, await unpublished_events_of(session, [due[key] for key in held], limit)


async def settle_round(
    session: AsyncSession,
    held: dict[str, str],
    sent: list[tuple[str, int]],
) -> set[str]:
    """Give up the `held` leases still ours and mark their `sent` events ((aggregate key,
    row id)) published, in the caller's transaction: the keys still ours. Released first,
    in one statement that tells which were ours: the mark commits with the release or
    neither does, so the order inside the transaction changes nothing."""
    ours = await leases.release_many(session, held)
    await mark_many_published(session, [row_id for key, row_id in sent if key in ours])
    return ours


async def mark_under_lease(
    session: AsyncSession,
    key: str,
    token: str,
    lease_seconds: float,
    row_ids: list[int],
    release: dict[str, str],
) -> bool:
    """Mark `row_ids` published, only while the lease on `key` is still ours (if it ended,
    another relay may be publishing the aggregate and owns its bookkeeping now), and give
    up the leases in `release`: False when the lease was lost."""
    if not await leases.renew(session, key, token, lease_seconds):
        return False
    await mark_many_published(session, row_ids)
    await leases.release_many(session, release)
    return True


async def dead_letter_under_lease(
    session: AsyncSession,
    key: str,
    token: str,
    lease_seconds: float,
    row: tuple[int, events_pb2.Event],
    error: BaseException,
    holder: str,
    release: dict[str, str],
) -> bool:
    """`mark_under_lease` for an event refused for good: moved to dead_letters."""
    if not await leases.renew(session, key, token, lease_seconds):
        return False
    row_id, event = row
    await dead_letter_event(session, row_id, event, error, holder)
    await leases.release_many(session, release)
    return True
