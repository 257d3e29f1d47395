"""Issue 11 item 3: next/delta links are followed only on the provider's own origin.

A second fake provider on another port plays the foreign host: it must never receive a
request (our bearer token would go with it), and the poll is a counted permanent error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select
from upload.sync.fake_provider import FakeProvider
from upload.sync.sync_world import DRIVE, SyncWorld

from services.upload.sync.graph import origin
from services.upload.sync.models import linked_drives, synced_items

LINK = "link-f"


@pytest.fixture
async def foreign() -> AsyncIterator[FakeProvider]:
    """Another host (port) that a malicious or confused provider might point us to."""
    async with FakeProvider() as provider:
        yield provider


def _refused() -> float:
    return REGISTRY.get_sample_value("serentak_sync_foreign_links_total") or 0.0


async def _cursor(world: SyncWorld) -> str | None:
    async with world.sessions() as s:
        return await s.scalar(select(linked_drives.c.delta_link).where(linked_drives.c.id == LINK))


@pytest.mark.parametrize("which", ["@odata.nextLink", "@odata.deltaLink"])
async def test_a_foreign_link_is_refused_unfetched_and_counted(
    world: SyncWorld, foreign: FakeProvider, which: str
) -> None:
    await world.link_drive(LINK)
    foreign.set_delta(DRIVE, "p2", [[{"id": "evil"}]], next_token="t9")
    world.fake.set_page(
        DRIVE, "", {"value": [{"id": "a", "name": "a"}], which: foreign.delta_url(DRIVE, "p2")}
    )
    before = _refused()
    await world.poll(LINK)
    assert foreign.calls == []
    assert _refused() == before + 1
    dead = await world.dead()
    assert len(dead) == 1 and "origin" in dead[0]["error_message"]
    # Nothing of the poll is kept: no cursor pointing away, no rows from the page.
    assert await _cursor(world) is None
    async with world.sessions() as s:
        assert (await s.execute(select(synced_items.c.id))).first() is None


async def test_a_stored_foreign_cursor_is_never_fetched(
    world: SyncWorld, foreign: FakeProvider
) -> None:
    """A cursor stored before links were checked is refused before any request."""
    await world.link_drive(LINK, delta_link=foreign.delta_url(DRIVE, "old"))
    await world.poll(LINK)
    assert foreign.calls == [] and world.fake.calls == []
    assert len(await world.dead()) == 1


async def test_links_on_the_providers_own_origin_are_followed(world: SyncWorld) -> None:
    await world.link_drive(LINK)
    world.fake.set_delta(DRIVE, "", [[{"id": "a"}], [{"id": "b"}]], next_token="t1")
    await world.poll(LINK)
    assert [c.key for c in world.fake.delta_calls(DRIVE)] == ["", "~p1"]
    assert await _cursor(world) == world.fake.delta_url(DRIVE, "t1")


def test_origin_compares_scheme_host_and_port() -> None:
    base = origin("https://graph.example.com/v1.0")
    assert base == ("https", "graph.example.com", 443)
    assert origin("https://GRAPH.example.com:443/v1.0/drives/x/root/delta?token=1") == base
    for other in (
        "http://graph.example.com/v1.0",
        "https://graph.example.com:8443/v1.0",
        "https://graph.example.com.evil.net/v1.0",
        "https://graph.example.com@evil.net/v1.0",
        "https://evil.net/graph.example.com",
    ):
        assert origin(other) != base, other
    for junk in ("", "/drives/x/root/delta", "not a url", "https://"):
        assert origin(junk) is None or origin(junk) != base, junk
