"""Rate limits per RPC family, per user and per tenant, that hold across replicas.

`limiter.py` has the algorithm, `policy.py` what a service limits, `gate.py` the RPC
boundary (rpc_wrapper.py asks it per method). The counts live where every replica of the
service already meets: PostgreSQL (`postgres_store.py`), etcd for the lock service
(services/locks/rate_store.py), or memory for a SQLite service, which has one replica.
"""

from __future__ import annotations

from sqlalchemy.engine import make_url

from services.common.rate_limits.gate import MethodRate, RateGate
from services.common.rate_limits.limiter import CounterStore, Limiter
from services.common.rate_limits.memory_store import MemoryCounterStore
from services.common.rate_limits.policy import FamilyLimits, RatePolicy, Rule
from services.common.rate_limits.postgres_store import PostgresCounterStore

__all__ = [
    "CounterStore",
    "FamilyLimits",
    "Limiter",
    "MemoryCounterStore",
    "MethodRate",
    "PostgresCounterStore",
    "RateGate",
    "RatePolicy",
    "Rule",
    "database_store",
]


def database_store(url: str) -> MemoryCounterStore | PostgresCounterStore:
    """The store for a service whose database is `url`: its PostgreSQL, shared by every
    replica; in memory for SQLite, a database of one replica."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return MemoryCounterStore()
    return PostgresCounterStore(parsed)
