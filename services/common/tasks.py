"""Ending the tasks a call started: cancelled, waited for, their outcome retrieved; and
work a call starts that must outlive it (`ShieldedWork`).

A task left pending when its call ends is destroyed by the garbage collector with "Task
was destroyed but it is pending!" (and whatever it held is never cleaned up); a task whose
exception nobody reads logs "Task exception was never retrieved". Every exit path of a
stream that starts tasks ends them with `finish` (issue #34).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def finish(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel `tasks` (None entries are skipped) and wait until every one has ended.

    Their exceptions are retrieved, not raised: the caller is already on its way out. If
    the caller is cancelled during the wait, the tasks still end (they are cancelled) and
    their outcome is still retrieved, by a done callback.
    """
    pending = [t for t in tasks if t is not None]
    for task in pending:
        task.add_done_callback(_retrieve)
        task.cancel()
    if pending:
        # asyncio.wait, not gather: a cancelled caller must not cancel them a second time
        # mid-cleanup (a task's own finally may still be awaiting its cleanup).
        await asyncio.wait(pending)


class ShieldedWork:
    """Work a call starts that must not end with the call (a commit half-way, a merge):
    run shielded from the caller's cancellation and tracked, so that its owner's close can
    let it finish (`wait`) or stop it (`cancel`) instead of leaving it to the collector."""

    def __init__(self) -> None:
        self._running: set[asyncio.Future[Any]] = set()

    async def run(self, work: Awaitable[T]) -> T:
        """`work`'s outcome; if the caller is cancelled meanwhile, `work` goes on."""
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def wait(self, grace_seconds: float) -> None:
        """Let the work under way finish, for at most `grace_seconds` (shutdown)."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=grace_seconds)

    async def cancel(self) -> None:
        """Cancel the work under way and wait until all of it has ended (shutdown)."""
        await finish(*self._running)
