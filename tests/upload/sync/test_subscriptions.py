"""Graph subscriptions: created and renewed by the periodic job, lifecycle notifications.

Against the fake provider on loopback, with the real webhook listener and job worker, on
both databases: the periodic job subscribes every linked drive of a tenant with a
credential (its own token, its own derived clientState) and renews before expiry (a
renewal the provider forgot becomes a create; 503 retries, 401 dead-letters); the
provider's lifecycle events act on their own drive only (`missed` -> delta,
`reauthorizationRequired` -> renew, `subscriptionRemoved` -> recreate + full
enumeration); anonymous, other-tenant and bad-clientState posts bounce off.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import sync_pb2, sync_pb2_grpc
from sqlalchemy import select, update
from support.ports import free_port
from upload.sync.sync_server import ALICE, sync_server
from upload.sync.sync_world import ACCOUNT, DRIVE, OTHER_TENANT, TENANT, TOKENS, SyncWorld, settings

from services.common.jobs.periodic import PeriodicScheduler
from services.upload.sync.jobs import SUBSCRIPTIONS_JOB, enqueue_unsubscribe, periodic_schedules
from services.upload.sync.models import linked_drives, utcnow
from services.upload.sync.notifications import client_state_for
from services.upload.sync.settings import SyncSettings
from services.upload.sync.webhooks import WebhookServer

ACME, EVIL, GHOST = "link-acme", "link-evil", "link-ghost"
INTERVAL, RENEW_BEFORE, LIFETIME = 60.0, 600.0, 3600.0


@pytest.fixture
def port() -> int:
    """The webhook listener's port (the public URL names it before the server starts)."""
    return free_port()


@pytest.fixture
def sync_settings(port: int) -> SyncSettings:
    """Subscriptions on: the provider posts to our loopback listener."""
    return settings(
        webhook_public_url=f"http://127.0.0.1:{port}",
        subscription_interval_seconds=INTERVAL,
        subscription_renew_before_seconds=RENEW_BEFORE,
        subscription_lifetime_seconds=LIFETIME,
    )


@pytest.fixture
async def hook(world: SyncWorld, port: int) -> AsyncIterator[str]:
    """Three links of DRIVE (acme, evil, and a tenant without a credential); the listener."""
    for link, tenant in ((ACME, TENANT), (EVIL, OTHER_TENANT), (GHOST, "ghost")):
        await world.link_drive(link, tenant)
    server = WebhookServer(world.engine, host="127.0.0.1", port=port)
    await server.start()
    yield server.url
    await server.stop()


class Ticks:
    """Runs the periodic scheduler one tick further each time, then the worker."""

    def __init__(self, world: SyncWorld) -> None:
        self.world = world
        # The service's own schedule for subscriptions (reconcile and purge left out).
        (schedule,) = [
            s for s in periodic_schedules(world.engine.settings) if s.job_type == SUBSCRIPTIONS_JOB
        ]
        assert schedule.interval_seconds == INTERVAL
        self.scheduler = PeriodicScheduler(world.sessions, [schedule], scheduler_id="test")
        self.at = time.time()

    async def run(self) -> None:
        self.at += INTERVAL
        await self.scheduler.run_due(self.at)
        await self.world.drain()


def _ops(operation: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "serentak_sync_subscription_operations_total",
        {"operation": operation, "outcome": outcome},
    )
    return value or 0.0


def _lifecycle(event: str) -> float:
    value = REGISTRY.get_sample_value("serentak_sync_lifecycle_events_total", {"event": event})
    return value or 0.0


async def _drives(world: SyncWorld) -> dict[str, dict[str, object]]:
    async with world.sessions() as s:
        rows = (await s.execute(select(linked_drives))).mappings().all()
    return {r["id"]: dict(r) for r in rows}


async def _expire_soon(world: SyncWorld, link: str) -> None:
    async with world.sessions() as s, s.begin():
        await s.execute(
            update(linked_drives)
            .where(linked_drives.c.id == link)
            .values(subscription_expires_at=utcnow() + timedelta(seconds=30))
        )


def _calls(world: SyncWorld, kind: str) -> list[object]:
    return [c for c in world.fake.calls if c.kind == kind]


async def test_periodic_job_creates_and_renews_subscriptions(world: SyncWorld, hook: str) -> None:
    before = {k: _ops(*k) for k in [("create", "ok"), ("renew", "ok"), ("renew", "not_found")]}
    ticks = Ticks(world)
    await ticks.run()
    drives = await _drives(world)
    # Each tenant with a credential, with its own token and its own clientState.
    assert sorted(c.token for c in _calls(world, "subscribe")) == sorted(TOKENS.values())
    assert drives[GHOST]["subscription_id"] is None
    for link, tenant in ((ACME, TENANT), (EVIL, OTHER_TENANT)):
        sub = world.fake.subscriptions[drives[link]["subscription_id"]]
        assert sub["clientState"] == client_state_for("s3cret", tenant, link)
        assert sub["resource"] == f"drives/{DRIVE}/root"
        assert sub["notificationUrl"] == f"{hook}/webhooks/graph"
        assert sub["lifecycleNotificationUrl"] == f"{hook}/webhooks/graph/lifecycle"
        left = drives[link]["subscription_expires_at"] - utcnow()
        assert timedelta(seconds=LIFETIME - 120) < left <= timedelta(seconds=LIFETIME)

    # Fresh subscriptions: the next tick calls nobody.
    await ticks.run()
    assert len(_calls(world, "subscribe")) == 2 and not _calls(world, "renew")

    # Due for renewal: PATCHed with acme's token, same id, expiry moved on.
    acme_sub = drives[ACME]["subscription_id"]
    await _expire_soon(world, ACME)
    await ticks.run()
    (renewal,) = _calls(world, "renew")
    assert (renewal.key, renewal.token) == (acme_sub, TOKENS[TENANT])
    renewed = (await _drives(world))[ACME]
    assert renewed["subscription_id"] == acme_sub
    assert renewed["subscription_expires_at"] - utcnow() > timedelta(seconds=LIFETIME - 120)

    # The provider forgot it: the renewal's 404 becomes a new subscription.
    world.fake.drop_subscription(acme_sub)
    await _expire_soon(world, ACME)
    await ticks.run()
    recreated = (await _drives(world))[ACME]["subscription_id"]
    assert recreated not in (None, acme_sub) and recreated in world.fake.subscriptions
    assert _ops("create", "ok") - before[("create", "ok")] == 3
    assert _ops("renew", "ok") - before[("renew", "ok")] == 1
    assert _ops("renew", "not_found") - before[("renew", "not_found")] == 1
    assert await world.dead() == []


async def test_subscription_failures_retry_then_dead_letter(world: SyncWorld, hook: str) -> None:
    failed = _ops("create", "failed"), _ops("renew", "failed")
    # Only acme's link: the others are unlinked, so failures are scripted for it alone.
    async with world.sessions() as s, s.begin():
        await s.execute(linked_drives.delete().where(linked_drives.c.id != ACME))
    world.fake.fail_subscriptions(503)
    ticks = Ticks(world)
    await ticks.run()
    assert len(_calls(world, "subscribe")) == 2  # 503, then created on the retry
    assert (await _drives(world))[ACME]["subscription_id"] is not None
    world.fake.fail_subscriptions(401)
    await _expire_soon(world, ACME)
    await ticks.run()
    (dead,) = await world.dead()
    assert dead["job_type"] == "upload.sync.subscription"
    assert _ops("create", "failed") - failed[0] == 1
    assert _ops("renew", "failed") - failed[1] == 1


async def test_lifecycle_events_act_on_their_own_drive(world: SyncWorld, hook: str) -> None:
    counts = {
        e: _lifecycle(e) for e in ("missed", "reauthorizationRequired", "subscriptionRemoved")
    }
    ticks = Ticks(world)
    await ticks.run()
    world.fake.set_delta(DRIVE, "", [[{"id": "i1", "name": "a.txt", "size": 1}]], next_token="t1")
    world.fake.set_delta(DRIVE, "t1", [[]], next_token="t1")
    async with world.sessions() as s, s.begin():
        await s.execute(update(linked_drives).values(delta_link=world.fake.delta_url(DRIVE, "t1")))
    drives = await _drives(world)
    acme_sub = drives[ACME]["subscription_id"]
    world.fake.calls.clear()

    # missed: acme's drive polls from its cursor; evil's link is not touched.
    assert await world.fake.emit_lifecycle(acme_sub, "missed") == 202
    await world.drain()
    assert [(c.kind, c.key, c.token) for c in world.fake.calls] == [("delta", "t1", TOKENS[TENANT])]
    world.fake.calls.clear()

    # reauthorizationRequired: renewed with acme's credential.
    assert await world.fake.emit_lifecycle(acme_sub, "reauthorizationRequired") == 202
    await world.drain()
    assert [(c.kind, c.key, c.token) for c in world.fake.calls] == [
        ("renew", acme_sub, TOKENS[TENANT])
    ]
    world.fake.calls.clear()

    # subscriptionRemoved: a new subscription, and a full enumeration despite the cursor.
    assert await world.fake.emit_lifecycle(acme_sub, "subscriptionRemoved") == 202
    world.fake.drop_subscription(acme_sub)
    await world.drain()
    assert sorted((c.kind, c.key, c.token) for c in world.fake.calls) == [
        ("delta", "", TOKENS[TENANT]),
        ("subscribe", "", TOKENS[TENANT]),
    ]
    after = (await _drives(world))[ACME]
    assert after["subscription_id"] not in (None, acme_sub)
    assert after["full_resync_count"] == 1
    assert (await _drives(world))[EVIL]["full_resync_count"] == 0
    for event, before in counts.items():
        assert _lifecycle(event) - before == 1
    world.fake.calls.clear()

    # A change notification of acme's (new) subscription polls acme's drive only.
    assert await world.fake.emit_change(after["subscription_id"]) == 202
    await world.drain()
    assert [(c.kind, c.token) for c in world.fake.calls] == [("delta", TOKENS[TENANT])]


async def test_lifecycle_posts_bounce_off(world: SyncWorld, hook: str) -> None:
    ticks = Ticks(world)
    await ticks.run()
    drives = await _drives(world)
    acme_sub, evil_sub = drives[ACME]["subscription_id"], drives[EVIL]["subscription_id"]
    evil_state = world.fake.subscriptions[evil_sub]["clientState"]
    world.fake.calls.clear()
    before = {e: _lifecycle(e) for e in ("missed", "subscriptionRemoved", "other")}
    url = f"{hook}/webhooks/graph/lifecycle"

    def entry(sub: str, **kw: object) -> dict[str, object]:
        return {"subscriptionId": sub, "lifecycleEvent": "subscriptionRemoved", **kw}

    refused = [
        # Anonymous: no clientState at all.
        (403, {"value": [entry(acme_sub)]}),
        (403, {"value": [entry(acme_sub, clientState="guess")]}),
        # Another tenant's (valid) clientState on acme's subscription.
        (403, {"value": [entry(acme_sub, clientState=evil_state)]}),
        # The shared secret itself is not acme's subscription's state.
        (403, {"value": [entry(acme_sub, clientState="s3cret")]}),
        (403, {"value": [entry("sub-unknown", clientState=evil_state)]}),
        # One bad entry refuses the whole batch.
        (403, {"value": [entry(evil_sub, clientState=evil_state), entry(acme_sub)]}),
        (400, {"value": [{"subscriptionId": evil_sub, "clientState": evil_state}]}),
        (400, {"value": "nope"}),
    ]
    async with httpx.AsyncClient() as client:
        for status, body in refused:
            r = await client.post(url, json=body)
            assert r.status_code == status, (body, r.text)
            assert r.headers["X-Content-Type-Options"] == "nosniff"
        r = await client.post(url, content=b"{not json")
        assert r.status_code == 400
        r = await client.post(url, params={"validationToken": "hello"})
        assert (r.status_code, r.text) == (200, "hello")
        # An event we do not know, on a real subscription: counted, nothing done.
        r = await client.post(
            url,
            json={"value": [entry(evil_sub, clientState=evil_state, lifecycleEvent="new")]},
        )
        assert r.status_code == 202
    assert await world.open_jobs() == []
    assert world.fake.calls == []
    assert _lifecycle("missed") == before["missed"]
    assert _lifecycle("subscriptionRemoved") == before["subscriptionRemoved"]
    assert _lifecycle("other") - before["other"] == 1


async def test_link_subscribes_at_once_and_unlink_unsubscribes(
    world: SyncWorld, tmp_path: Path, hook: str
) -> None:
    world.fake.set_delta("drv-new", "", [[]], next_token="t1")
    async with sync_server(world, tmp_path) as channel:
        sync = sync_pb2_grpc.SyncServiceStub(channel)
        link = await sync.LinkDrive(
            sync_pb2.LinkDriveRequest(account_id=ACCOUNT, upstream_drive_id="drv-new"),
            metadata=ALICE,
        )
        await world.drain()
        (call,) = _calls(world, "subscribe")
        assert (call.drive, call.token) == ("drv-new", TOKENS[TENANT])
        sub_id = (await _drives(world))[link.linked_drive_id]["subscription_id"]
        state = world.fake.subscriptions[sub_id]["clientState"]
        lifecycle_url = world.fake.subscriptions[sub_id]["lifecycleNotificationUrl"]
        deleted = _ops("delete", "ok")

        await sync.UnlinkDrive(
            sync_pb2.UnlinkDriveRequest(linked_drive_id=link.linked_drive_id), metadata=ALICE
        )
        await world.drain()
    (call,) = _calls(world, "unsubscribe")
    assert (call.key, call.token) == (sub_id, TOKENS[TENANT])
    assert sub_id not in world.fake.subscriptions
    assert _ops("delete", "ok") - deleted == 1
    # A late notification of the old subscription acts on nothing.
    body = {"value": [{"subscriptionId": sub_id, "clientState": state, "lifecycleEvent": "missed"}]}
    async with httpx.AsyncClient() as client:
        assert (await client.post(lifecycle_url, json=body)).status_code == 403
    assert await world.open_jobs() == []


async def test_unsubscribe_of_a_subscription_already_gone_is_done(world: SyncWorld) -> None:
    gone = _ops("delete", "not_found")
    async with world.sessions() as s, s.begin():
        await enqueue_unsubscribe(s, TENANT, "sub-forgotten")
    await world.drain()
    assert [(c.kind, c.key) for c in world.fake.calls] == [("unsubscribe", "sub-forgotten")]
    assert await world.dead() == []
    assert _ops("delete", "not_found") - gone == 1
