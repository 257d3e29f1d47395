"""The webhook endpoint over real HTTP: handshake, client state, collapsing bursts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from upload.sync.sync_world import DRIVE, SyncWorld

from services.upload.sync.jobs import DELTA_JOB
from services.upload.sync.webhooks import MAX_BODY_BYTES, MAX_VALIDATION_TOKEN, WebhookServer


@pytest.fixture
async def hook(world: SyncWorld) -> AsyncIterator[str]:
    """The webhook endpoint's URL, served on a free loopback port."""
    await world.link_drive("link-1")
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


# -- issue 11 item 11: edges --------------------------------------------------------------


async def test_malformed_or_deeply_nested_bodies_are_400_never_500(
    world: SyncWorld, hook: str
) -> None:
    deep = b"[" * 200_000 + b"]" * 200_000
    bodies = [
        deep,
        b'{"value": ' + deep + b"}",
        # Under the parser's limit, but nested where a string is expected.
        json.dumps({"value": [{"clientState": "s3cret", "resource": _nested(500)}]}).encode(),
        b'{"value": [1, 2]}',
        b'{"value": "x"}',
        b"[]",
        b"\xff\xfe",
        b'{"value": [{"clientState": "s3cret", "resource": "drives/%s/root"}]' % DRIVE.encode(),
    ]
    async with httpx.AsyncClient() as client:
        for body in bodies:
            r = await client.post(hook, content=body)
            assert r.status_code == 400, (body[:40], r.status_code, r.text[:200])
            assert r.headers["x-content-type-options"] == "nosniff"
    assert await world.open_jobs() == []


def _nested(depth: int) -> object:
    value: object = "drives/x/root"
    for _ in range(depth):
        value = [value]
    return value


async def test_every_response_says_nosniff(world: SyncWorld, hook: str) -> None:
    world.fake.set_delta(DRIVE, "", [[]], next_token="t1")
    base = hook.rsplit("/", 2)[0]
    async with httpx.AsyncClient() as client:
        answers = [
            await client.post(hook, params={"validationToken": "<script>x</script>"}),
            await client.post(hook, json=_notification("s3cret")),
            await client.post(hook, json=_notification("wrong")),
            await client.post(hook, content=b"{"),
            await client.get(hook),
            await client.post(base + "/elsewhere", content=b"{}"),
            await client.post(hook, content=b"x" * (MAX_BODY_BYTES + 1)),
        ]
    assert [r.status_code for r in answers] == [200, 202, 403, 400, 405, 404, 413]
    for r in answers:
        assert r.headers.get("x-content-type-options") == "nosniff", r.status_code


async def test_a_validation_token_carries_no_notification(world: SyncWorld, hook: str) -> None:
    """The handshake echoes the token and does nothing else, whatever the body says."""
    async with httpx.AsyncClient() as client:
        bad = await client.post(
            hook, params={"validationToken": "tok"}, json=_notification("wrong")
        )
        good = await client.post(
            hook, params={"validationToken": "tok"}, json=_notification("s3cret")
        )
        long = await client.post(hook, params={"validationToken": "t" * (MAX_VALIDATION_TOKEN + 1)})
        empty = await client.post(hook, params={"validationToken": ""})
    for r in (bad, good):
        assert r.status_code == 200 and r.text == "tok"
        assert r.headers["content-type"].startswith("text/plain")
    assert long.status_code == 400 and empty.status_code == 400
    assert await world.open_jobs() == []
