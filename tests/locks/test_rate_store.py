"""Rate counts in etcd (services/locks/rate_store.py) on a real server: two replicas'
stores racing compare-and-swaps on one key never count past the limit; a count lives on a
lease that outlasts its window by one more; no lock folder is touched."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from prometheus_client import REGISTRY
from support.etcd import EtcdServer

from services.common.rate_limits import Limiter
from services.locks.etcd_client import Etcd, prefix_end
from services.locks.rate_store import RATE_FOLDER, EtcdCounterStore

pytestmark = pytest.mark.etcd
WINDOW = 86_400.0  # a test never straddles two windows (checked)


def _store_errors() -> float:
    return (
        REGISTRY.get_sample_value("serentak_rate_limit_store_errors_total", {"service": "test"})
        or 0.0
    )


async def test_racing_replicas_never_count_past_the_limit(etcd: EtcdServer) -> None:
    prefix = f"/t/{uuid.uuid4().hex}/"
    clients = [Etcd(etcd.endpoint, call_timeout=5) for _ in range(2)]
    try:
        for limit, calls, batch_max in ((30, 120, 32), (600, 900, 32), (40, 300, 1)):
            replicas = [
                Limiter(
                    EtcdCounterStore(client, prefix, WINDOW),
                    service="test",
                    window_seconds=WINDOW,
                    batch_max=batch_max,
                )
                for client in clients
            ]
            window = int(time.time() // WINDOW)
            key = f"acme/{limit}/{batch_max}"
            failed_open = _store_errors()
            results = await asyncio.gather(
                *(replicas[i % 2].take(key, limit) for i in range(calls))
            )
            assert int(time.time() // WINDOW) == window, "straddled a window: run it again"
            admitted = sum(r is None for r in results)
            slack = 2 * (replicas[0].batch(limit) - 1)
            # A call is let through uncounted only when etcd did not answer (fail open),
            # and then counted as a store error (on a loaded machine a call can time out).
            failed_open = _store_errors() - failed_open
            assert limit - slack <= admitted <= limit + failed_open, (limit, admitted)
        folder = prefix.encode() + RATE_FOLDER
        kvs, _, _ = await clients[0].scan(folder, prefix_end(folder), limit=100)
        # One counter per key and window, each exactly at its limit, on a lease.
        assert sorted(int(kv.value) for kv in kvs) == [30, 40, 600]
        assert all(kv.lease for kv in kvs)
        remaining = await clients[0].lease_remaining(kvs[0].lease)
        assert WINDOW < remaining <= 2 * WINDOW + 1
    finally:
        for client in clients:
            await client.close()
