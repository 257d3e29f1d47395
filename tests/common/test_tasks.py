"""`ShieldedWork`: work a call starts goes on when its caller is cancelled, and its owner's
close waits for it or stops it."""

from __future__ import annotations

import asyncio

import pytest

from services.common.tasks import ShieldedWork


async def test_work_outlives_a_cancelled_caller_and_close_waits_for_it() -> None:
    work = ShieldedWork()
    started, release = asyncio.Event(), asyncio.Event()
    done: list[str] = []

    async def commit() -> str:
        started.set()
        await release.wait()
        done.append("committed")
        return "committed"

    caller = asyncio.ensure_future(work.run(commit()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert done == []  # the caller is gone, the work is not
    release.set()
    await work.wait(grace_seconds=5)
    assert done == ["committed"]


async def test_the_callers_answer_is_the_works() -> None:
    work = ShieldedWork()

    async def answer() -> int:
        return 42

    assert await work.run(answer()) == 42
    with pytest.raises(ValueError):
        await work.run(_fails())


async def _fails() -> None:
    raise ValueError("refused")


async def test_cancel_stops_what_is_under_way_and_waits_for_its_cleanup() -> None:
    work = ShieldedWork()
    cleaned = asyncio.Event()
    started = asyncio.Event()

    async def merge() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()  # e.g. the job handed back to the runtime

    caller = asyncio.ensure_future(work.run(merge()))
    await started.wait()
    await work.cancel()
    assert cleaned.is_set()
    with pytest.raises(asyncio.CancelledError):
        await caller
