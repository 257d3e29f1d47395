"""Lock wait and contention by key pattern (the seeds' `file` and `user` locks): an Acquire
that waits for a held lock counts contention outcome=waited and a wait observed as
acquired; one that gives up counts outcome=failed and a wait observed as timed_out; each
under its own key's pattern only."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from locks.lock_assertions import wait_for_waiters
from locks.principals import SERVICE_TOKEN, bearer
from prometheus_client import REGISTRY
from serentak.locks.v1 import locks_pb2

pytestmark = pytest.mark.etcd

PATTERNS = ("file", "user")


def _snapshot() -> dict[tuple[str, str, str], float]:
    values = {}
    for pattern in PATTERNS:
        for outcome in ("waited", "failed"):
            values[("contention", outcome, pattern)] = (
                REGISTRY.get_sample_value(
                    "serentak_lock_contention_total", {"outcome": outcome, "pattern": pattern}
                )
                or 0.0
            )
        for outcome in ("acquired", "timed_out"):
            values[("wait", outcome, pattern)] = (
                REGISTRY.get_sample_value(
                    "serentak_lock_wait_seconds_count", {"outcome": outcome, "pattern": pattern}
                )
                or 0.0
            )
    return values


@pytest.mark.parametrize("pattern", PATTERNS)
async def test_wait_and_contention_are_counted_by_key_pattern(lock_service, pattern: str) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    other = "user" if pattern == "file" else "file"
    suffix = uuid.uuid4().hex[:8]
    key = f"file:{suffix}" if pattern == "file" else f"user:alice:quota-{suffix}"
    # file: keys are the merge's: taken as the upload principal, in alice's tenant.
    md, tenant = (bearer(SERVICE_TOKEN), "acme") if pattern == "file" else ((), "")
    before = _snapshot()

    held = await stub.Acquire(
        locks_pb2.AcquireRequest(
            key=key, owner="first", ttl_seconds=10, wait_timeout_ms=0, tenant_id=tenant
        ),
        metadata=md,
    )
    # A contender that gives up.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Acquire(
            locks_pb2.AcquireRequest(
                key=key, owner="late", ttl_seconds=10, wait_timeout_ms=200, tenant_id=tenant
            ),
            metadata=md,
        )
    assert refused.value.code() == grpc.StatusCode.ABORTED
    # A contender that waits, then gets the lock when the first releases.
    waiter = asyncio.ensure_future(
        stub.Acquire(
            locks_pb2.AcquireRequest(
                key=key, owner="second", ttl_seconds=10, wait_timeout_ms=10_000, tenant_id=tenant
            ),
            metadata=md,
        )
    )
    await wait_for_waiters(stub, key, 1, metadata=md, tenant=tenant)
    await stub.Release(
        locks_pb2.ReleaseRequest(key=key, token=held.token, tenant_id=tenant), metadata=md
    )
    second = await waiter
    assert second.token > held.token
    await stub.Release(
        locks_pb2.ReleaseRequest(key=key, token=second.token, tenant_id=tenant), metadata=md
    )

    after = _snapshot()
    moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert moved == {
        ("contention", "failed", pattern): 1,
        ("contention", "waited", pattern): 1,
        # The uncontended first Acquire and the waiter both end acquired.
        ("wait", "acquired", pattern): 2,
        ("wait", "timed_out", pattern): 1,
    }, moved
    assert not any(k[2] == other for k in moved)
