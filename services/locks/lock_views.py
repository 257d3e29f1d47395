"""What a lock looks like: the record a contender key stores, and the views callers see.

The views mirror the `Lock`, `Waiter` and `DescribeResponse` messages; `servicer.py` turns
them into protobuf, `mutex.py` builds them from etcd's keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Record:
    """What a contender key stores (JSON): who, since when, under which request."""

    owner: str
    correlation_id: str
    ttl: int
    waiting_since: float
    acquired_at: float | None = None
    # Set (once) before Refresh or Hold renews the lease: the lease is then never reused.
    renewed: bool = False

    def encode(self) -> bytes:
        data = dict(self.__dict__)
        if not self.renewed:
            del data["renewed"]  # the common case stays as it was
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Record:
        """Tolerant: a foreign or damaged value still shows up, with blanks."""
        try:
            data = json.loads(raw)
            return cls(
                owner=str(data.get("owner", "")),
                correlation_id=str(data.get("correlation_id", "")),
                ttl=int(data.get("ttl", 0)),
                waiting_since=float(data.get("waiting_since", 0.0)),
                acquired_at=data.get("acquired_at"),
                renewed=data.get("renewed") is True,
            )
        except (ValueError, TypeError, AttributeError):
            return cls(owner="", correlation_id="", ttl=0, waiting_since=0.0)


@dataclass(frozen=True)
class LockView:
    """A lock's holder as callers see it (mirrors the `Lock` message)."""

    key: str
    token: int
    owner: str
    lease_id: int
    acquired_at: float
    expires_at: float
    correlation_id: str
    ttl_seconds: int


@dataclass(frozen=True)
class WaiterView:
    """A queued contender (mirrors the `Waiter` message)."""

    owner: str
    create_revision: int
    lease_id: int
    waiting_since: float
    correlation_id: str


@dataclass(frozen=True)
class LockState:
    """Holder and waiters of one lock, oldest first."""

    holder: LockView | None
    waiters: list[WaiterView] = field(default_factory=list)


def lock_view(
    name: str, token: int, lease: int, record: Record, acquired_at: float, expires_at: float
) -> LockView:
    """The holder's view of lock `name` from its key's record."""
    return LockView(
        key=name,
        token=token,
        owner=record.owner,
        lease_id=lease,
        acquired_at=acquired_at,
        expires_at=expires_at,
        correlation_id=record.correlation_id,
        ttl_seconds=record.ttl,
    )
