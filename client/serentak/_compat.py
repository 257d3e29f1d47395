"""What the client needs that Python 3.10 spells differently (3.10 to 3.13 supported).

`timeout`: `asyncio.timeout` on 3.11+, the `async-timeout` backport on 3.10. Not
`asyncio.wait_for`: on 3.11 it swallows a cancellation that races its result (the lock
client's watcher would then renew forever after being cancelled). `DeadlineExceeded` is what
`timeout` raises: the builtin TimeoutError on 3.11+, `asyncio.TimeoutError` on 3.10 (where
the two are different classes).

`uncancel(task)`: `Task.uncancel()` on 3.11+, where a task counts the cancellations asked of
it (asyncio.timeout and TaskGroup read the count); 3.10 keeps no count, so nothing to undo.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

if sys.version_info >= (3, 11):
    from asyncio import timeout as timeout

    DeadlineExceeded = TimeoutError
else:  # pragma: no cover - exercised by the 3.10 packaging test
    from async_timeout import timeout as timeout

    DeadlineExceeded = asyncio.TimeoutError


def uncancel(task: asyncio.Task[Any]) -> None:
    """Undo one `task.cancel()` that was handled (3.11+; nothing to undo on 3.10)."""
    if sys.version_info >= (3, 11):
        task.uncancel()


__all__ = ["DeadlineExceeded", "timeout", "uncancel"]
