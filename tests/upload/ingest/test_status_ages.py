"""`serentak_upload_oldest_in_status_seconds`: the gauge behind the stuck-upload alerts
(deploy/prometheus/alerts.yml) follows uploads into and out of `uploading` and `merging`."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import REGISTRY
from sqlalchemy import update
from upload.upload_helpers import create_request

from services.common.db import create_engine, session_factory
from services.upload.ingest.status_ages import refresh_status_ages
from services.upload.models import MERGING, UploadRow, utcnow

CHUNK = 1024


def _gauge(status: str) -> float | None:
    return REGISTRY.get_sample_value("serentak_upload_oldest_in_status_seconds", {"status": status})


async def test_gauge_follows_the_oldest_upload_per_status(cluster) -> None:
    alice = cluster["alice"]
    engine = create_engine(cluster.settings.database_url)
    sessions = session_factory(engine)
    try:
        assert await refresh_status_ages(sessions) == {"uploading": 0.0, "merging": 0.0}
        assert _gauge("uploading") == 0.0

        data = b"x" * (CHUNK * 2)
        upload = await alice.uploads.CreateUpload(
            create_request(data, CHUNK), metadata=alice.metadata
        )
        # Created an hour ago and stuck merging for ten minutes (set directly: no waiting).
        hour_ago = utcnow() - timedelta(hours=1)
        async with sessions.begin() as session:
            await session.execute(
                update(UploadRow)
                .where(UploadRow.id == upload.upload_id)
                .values(created_at=hour_ago)
            )
        await refresh_status_ages(sessions)
        assert 3600 <= _gauge("uploading") < 3700
        assert _gauge("merging") == 0.0

        async with sessions.begin() as session:
            await session.execute(
                update(UploadRow)
                .where(UploadRow.id == upload.upload_id)
                .values(status=MERGING, merge_started_at=utcnow() - timedelta(minutes=10))
            )
        await refresh_status_ages(sessions)
        assert _gauge("uploading") == 0.0
        assert 600 <= _gauge("merging") < 700
    finally:
        await engine.dispose()
