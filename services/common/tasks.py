"""Ending the tasks a call started: cancelled, waited for, their outcome retrieved.

A task left pending when its call ends is destroyed by the garbage collector with "Task
was destroyed but it is pending!" (and whatever it held is never cleaned up); a task whose
exception nobody reads logs "Task exception was never retrieved". Every exit path of a
stream that starts tasks ends them with `finish` (issue #34).
"""

from __future__ import annotations

import asyncio
from typing import Any


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
