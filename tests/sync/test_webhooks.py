"""The webhook endpoint over real HTTP: handshake, client state, collapsing bursts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import insert
from sync.sync_world import ACCOUNT, DRIVE, TENANT, SyncWorld

from services.upload.sync.jobs import DELTA_JOB
from services.upload.sync.models import linked_drives, utcnow
from services.upload.sync.webhooks import WebhookServer


@pytest.fixture
async def hook(world: SyncWorld) -> AsyncIterator[str]:
    """The webhook endpoint's URL, served on a free loopback port."""
    now = utcnow()
    async with world.sessions() as s, s.begin():
        await s.execute(
            insert(linked_drives).values(
                id="link-1",
                tenant_id=TENANT,
                account_id=ACCOUNT,
                upstream_drive_id=DRIVE,
                full_resync_count=0,
                created_at=now,
                updated_at=now,
            )
        )
    server = WebhookServer(world.engine, host="127.0.0.1", port=0)
    await server.start()
    yield server.url + world.engine.settings.webhook_path
    await server.stop()


def _notification(client_state: str, drive: str = DRIVE) -> dict[str, object]:
    return {
        "value": [
            {
                "subscriptionId": "sub-1",
                "clientState": client_state,
                "resource": f"drives/{drive}/root",
                "changeType": "updated",
            }
        ]
    }


async def test_validation_handshake_echoes_the_token(hook: str) -> None:
    async with httpx.AsyncClient() as client:
        r = await client.post(hook, params={"validationToken": "abc 123"})
    assert r.status_code == 200
    assert r.text == "abc 123"
    assert r.headers["content-type"].startswith("text/plain")


async def test_bad_client_state_is_refused_and_queues_nothing(world: SyncWorld, hook: str) -> None:
    async with httpx.AsyncClient() as client:
        bad = await client.post(hook, json=_notification("wrong"))
        garbage = await client.post(hook, content=b"not json")
        missing = await client.post(hook, json={"value": [{"resource": f"drives/{DRIVE}"}]})
    assert bad.status_code == 403
    assert garbage.status_code == 400
    assert missing.status_code == 403
    assert await world.open_jobs() == []


async def test_duplicate_webhooks_collapse_into_one_delta_poll(world: SyncWorld, hook: str) -> None:
    world.fake.set_delta(DRIVE, "", [[{"id": "a", "name": "a"}]], next_token="t1")
    async with httpx.AsyncClient() as client:
        for _ in range(12):
            r = await client.post(hook, json=_notification("s3cret"))
            assert r.status_code == 202
    queued = [j for j in await world.open_jobs() if j["job_type"] == DELTA_JOB]
    assert len(queued) == 1
    assert queued[0]["collapsed"] == 11
    await world.drain()
    assert len(world.fake.delta_calls(DRIVE)) == 1


async def test_unknown_drive_is_accepted_but_polls_nothing(world: SyncWorld, hook: str) -> None:
    async with httpx.AsyncClient() as client:
        r = await client.post(hook, json=_notification("s3cret", drive="someone-else"))
    assert r.status_code == 202
    assert await world.open_jobs() == []
