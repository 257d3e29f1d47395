"""`serentak_upload_tenant_quota_used_ratio_max`: the gauge behind SerentakTenantStorageNearQuota
(deploy/prometheus/alerts.yml) counts what the quota check counts — stored files plus open
uploads — and follows the tenant with the largest share."""

from __future__ import annotations

import os

from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import chunk_request, create_request, wait_status

from services.common.db import create_engine, session_factory
from services.upload.storage.quota_use import refresh_quota_use

CHUNK = 1024
QUOTA = 10_000


def _gauge() -> float | None:
    return REGISTRY.get_sample_value("serentak_upload_tenant_quota_used_ratio_max")


async def test_gauge_is_the_largest_tenants_share(cluster) -> None:
    alice, mallory = cluster["alice"], cluster["mallory"]  # tenants acme and evil
    engine = create_engine(cluster.settings.database_url)
    sessions = session_factory(engine)
    try:
        empty = await refresh_quota_use(sessions, QUOTA)
        assert (empty.tenant_id, empty.ratio, _gauge()) == ("", 0.0, 0.0)

        # acme: one stored 1 KiB file and an open 3 KiB upload; evil: an open 2 KiB upload.
        stored = os.urandom(CHUNK)
        done = await alice.uploads.CreateUpload(
            create_request(stored, CHUNK), metadata=alice.metadata
        )
        await alice.uploads.PutChunk(
            chunk_request(done.upload_id, 0, stored), metadata=alice.metadata
        )
        await wait_status(alice, done.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
        await alice.uploads.CreateUpload(
            create_request(b"a" * (3 * CHUNK), CHUNK, name="open.bin"), metadata=alice.metadata
        )
        await mallory.uploads.CreateUpload(
            create_request(b"m" * (2 * CHUNK), CHUNK), metadata=mallory.metadata
        )
        use = await refresh_quota_use(sessions, QUOTA)
        assert (use.tenant_id, use.used_bytes) == ("acme", 4 * CHUNK)
        assert _gauge() == use.ratio == 4 * CHUNK / QUOTA

        # Past the alert's 90 %: a smaller quota for the same store.
        near = await refresh_quota_use(sessions, 4 * CHUNK + 100)
        assert near.ratio > 0.9 and _gauge() == near.ratio
    finally:
        await engine.dispose()
