"""Reading and authenticating webhook bodies: change and lifecycle notifications alike.

Each subscription we create carries its own clientState, derived from the shared secret
and the drive link (`client_state_for`: HMAC-SHA256 of tenant and link id), so a state
seen for one tenant's subscription can act on nothing else. An entry is authentic when:
- its `subscriptionId` names a linked drive's subscription and its `clientState` equals
  that drive's derived state (the entry then acts on that drive only, in its tenant), or
- it names no known subscription and carries the shared secret itself (subscriptions
  made outside Serentak; change notifications then poll every link of the named drive).
A batch with any other entry is refused whole (403), before anything is queued. Every
comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncSession

from services.upload.sync.graph import drive_of
from services.upload.sync.models import linked_drives
from services.upload.sync.provider import WebhookRefused

LIFECYCLE_EVENTS = ("subscriptionRemoved", "missed", "reauthorizationRequired")
MAX_ENTRIES = 1000


def client_state_for(secret: str, tenant_id: str, drive_link_id: str) -> str:
    """The clientState of one drive link's subscription (64 hex characters)."""
    message = f"{tenant_id}\x00{drive_link_id}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Entry:
    """One notification of a batch, read but not yet trusted."""

    subscription_id: str
    client_state: str
    resource: str
    lifecycle_event: str


def _text(n: Mapping[str, Any], key: str, limit: int = 1024) -> str:
    value = n.get(key, "")
    if not isinstance(value, str) or len(value) > limit:
        raise WebhookRefused(f"notification {key} is not a string of at most {limit} characters")
    return value


def read_entries(payload: Mapping[str, Any], *, lifecycle: bool) -> list[Entry]:
    """The batch's entries (400 on a wrong shape). Change notifications must name a drive."""
    values = payload.get("value")
    if not isinstance(values, list) or not values:
        raise WebhookRefused("notification body has no 'value' list")
    if len(values) > MAX_ENTRIES:
        raise WebhookRefused(f"more than {MAX_ENTRIES} notifications in one body")
    entries = []
    for n in values:
        if not isinstance(n, Mapping):
            raise WebhookRefused("notification is not an object")
        if not isinstance(n.get("clientState"), str):
            # Anonymous: nothing vouches for this entry.
            raise WebhookRefused("clientState does not match", status=403)
        entry = Entry(
            subscription_id=_text(n, "subscriptionId", 255),
            client_state=_text(n, "clientState"),
            resource=_text(n, "resource"),
            lifecycle_event=_text(n, "lifecycleEvent", 64),
        )
        if lifecycle and not entry.lifecycle_event:
            raise WebhookRefused("lifecycle notification has no lifecycleEvent")
        if not lifecycle and drive_of(entry.resource) is None:
            raise WebhookRefused("notification resource names no drive")
        entries.append(entry)
    return entries


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


async def authenticate(
    session: AsyncSession, entries: list[Entry], secret: str
) -> list[tuple[Entry, RowMapping | None]]:
    """Each entry with the drive link its subscription names (None: a shared-secret entry).

    Raises WebhookRefused(403) if any entry fails (see the module docstring).
    """
    ids = {e.subscription_id for e in entries if e.subscription_id}
    drives: dict[str, list[RowMapping]] = {}
    if ids:
        rows = (
            (
                await session.execute(
                    select(linked_drives).where(linked_drives.c.subscription_id.in_(ids))
                )
            )
            .mappings()
            .all()
        )
        for row in rows:
            drives.setdefault(row["subscription_id"], []).append(row)
    out: list[tuple[Entry, RowMapping | None]] = []
    for entry in entries:
        known = drives.get(entry.subscription_id, [])
        match = [
            d
            for d in known
            if _same(entry.client_state, client_state_for(secret, d["tenant_id"], d["id"]))
        ]
        if match:
            out.append((entry, match[0]))
        elif not known and _same(entry.client_state, secret):
            out.append((entry, None))
        else:
            raise WebhookRefused("clientState does not match", status=403)
    return out
