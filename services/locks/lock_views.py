"""What a lock looks like: the record a contender key stores, and the views callers see.

The views mirror the `Lock`, `Waiter` and `DescribeResponse` messages; `servicer.py` turns
them into protobuf, `mutex.py` builds them from etcd's keys. Who may see a holder's
identity is `Caller.sees` (the rules: `tenancy.py`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Caller:
    """Who makes a call: the principal recorded with the locks it takes (`user:{id}`,
    `service:{name}`), and whether it is an operator (holds the `ops` role)."""

    principal: str
    operator: bool = False

    def holds(self, recorded: str) -> bool:
        """Whether a lock recorded as acquired by `recorded` is this caller's.

        An empty record is a lock from before principals were recorded (an older replica
        during a rolling upgrade): bound to its tenant and token only, as it was.
        """
        return not recorded or recorded == self.principal

    def sees(self, recorded: str) -> bool:
        """Whether this caller may see who holds (or waits for) a lock: its own, or any
        lock for an operator."""
        return self.operator or (bool(recorded) and recorded == self.principal)


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
    # The principal that acquired the lock (`Caller.principal`); "" in older records.
    principal: str = ""

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
                principal=str(data.get("principal", "")),
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
    principal: str = ""

    def hidden(self) -> LockView:
        """What a caller who may not see the holder gets: that it is held, and until when."""
        return dataclasses.replace(
            self, token=0, owner="", lease_id=0, correlation_id="", principal=""
        )


@dataclass(frozen=True)
class WaiterView:
    """A queued contender (mirrors the `Waiter` message)."""

    owner: str
    create_revision: int  # its fencing token once it holds the lock
    lease_id: int
    waiting_since: float
    correlation_id: str
    principal: str = ""

    def hidden(self) -> WaiterView:
        """That someone waits, and since when; not who, nor its future token."""
        return WaiterView("", 0, 0, self.waiting_since, "")


@dataclass(frozen=True)
class LockState:
    """Holder and waiters of one lock, oldest first."""

    holder: LockView | None
    waiters: list[WaiterView] = field(default_factory=list)

    def seen_by(self, caller: Caller) -> LockState:
        """This state with every holder and waiter `caller` may not see hidden."""
        holder = self.holder
        if holder is not None and not caller.sees(holder.principal):
            holder = holder.hidden()
        waiters = [w if caller.sees(w.principal) else w.hidden() for w in self.waiters]
        return LockState(holder, waiters)


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
        principal=record.principal,
    )


def waiter_view(create_revision: int, lease: int, record: Record) -> WaiterView:
    """A queued contender's view from its key's record."""
    return WaiterView(
        record.owner,
        create_revision,
        lease,
        record.waiting_since,
        record.correlation_id,
        record.principal,
    )
