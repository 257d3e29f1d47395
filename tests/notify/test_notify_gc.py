"""The notify process freezes its start-up heap while it serves (`gc_tuning.py`): full
collections skip it; garbage made while serving is still collected; the last app to
stop gives the heap back to the collector, and the collector's thresholds as they were;
`SERENTAK_NOTIFY_GC_FREEZE=false` leaves the collector alone. While serving, the young
generation is collected once per `notify_gc_young_threshold` allocations, so a fan-out's
short-lived objects die before they are promoted into full collections."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from notify.harness import user_md
from pydantic import ValidationError
from serentak.notify.v1 import notify_pb2

from services.common.config import load
from services.notify.settings import NotifySettings


def _in_collector(obj: object) -> bool:
    """Whether the collector walks `obj` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def test_a_running_notify_freezes_its_start_up_heap_and_gives_it_back_at_stop(
    notify_factory: Callable[..., Any],
) -> None:
    assert gc.get_freeze_count() == 0
    thresholds = gc.get_threshold()
    async with notify_factory() as notify:
        # A call through the service: start-up is over.
        await notify.stub.GetUnreadCount(
            notify_pb2.GetUnreadCountRequest(), metadata=user_md("alice")
        )
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (50_000, 20, 10)
        broker = notify.parts.broker
        assert not _in_collector(broker)
        # Garbage made while serving is collected as before.
        cycle = _Cycle()
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == thresholds
    assert _in_collector(broker)


async def test_a_young_threshold_of_0_keeps_the_collectors_thresholds(
    notify_factory: Callable[..., Any],
) -> None:
    thresholds = gc.get_threshold()
    async with notify_factory(notify_gc_young_threshold=0) as notify:
        await notify.stub.GetUnreadCount(
            notify_pb2.GetUnreadCountRequest(), metadata=user_md("alice")
        )
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == thresholds


async def test_the_heap_stays_frozen_until_the_last_app_in_the_process_stops(
    notify_factory: Callable[..., Any],
) -> None:
    async with notify_factory() as first:
        async with notify_factory() as second:
            await second.stub.GetUnreadCount(
                notify_pb2.GetUnreadCountRequest(), metadata=user_md("alice")
            )
            assert not _in_collector(second.parts.broker)
        # The second stopped; the first still serves on a frozen heap.
        assert gc.get_freeze_count() > 0
        assert not _in_collector(first.parts.broker)
    assert gc.get_freeze_count() == 0


async def test_notify_gc_freeze_false_leaves_the_collector_alone(
    notify_factory: Callable[..., Any],
) -> None:
    async with notify_factory(notify_gc_freeze=False) as notify:
        await notify.stub.GetUnreadCount(
            notify_pb2.GetUnreadCountRequest(), metadata=user_md("alice")
        )
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold()[0] != 50_000
        assert _in_collector(notify.parts.broker)


def test_notify_gc_freeze_defaults_on_and_a_bad_value_stops_the_start_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERENTAK_AUTH_MODE", "dev")
    assert load(NotifySettings).notify_gc_freeze is True
    monkeypatch.setenv("SERENTAK_NOTIFY_GC_FREEZE", "false")
    assert load(NotifySettings).notify_gc_freeze is False
    monkeypatch.setenv("SERENTAK_NOTIFY_GC_FREEZE", "sometimes")
    with pytest.raises(ValidationError, match="notify_gc_freeze"):
        load(NotifySettings)


def test_a_negative_young_threshold_stops_the_start_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERENTAK_AUTH_MODE", "dev")
    assert load(NotifySettings).notify_gc_young_threshold == 50_000
    monkeypatch.setenv("SERENTAK_NOTIFY_GC_YOUNG_THRESHOLD", "-1")
    with pytest.raises(ValidationError, match="notify_gc_young_threshold"):
        load(NotifySettings)
