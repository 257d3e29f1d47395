"""A stopping loop really stops: no `asyncio.wait_for` in the services.

On Python 3.11, `asyncio.wait_for` returns the inner result when a cancellation arrives in
the same loop iteration as that result, so the cancel is lost. A watcher loop built on it
(the lock client's Hold watcher, a worker's idle wait) then runs on after its owner
cancelled it; in CI a merge commit stayed `idle in transaction` for minutes behind one,
blocking every other commit in the folder. `asyncio.timeout` keeps the cancellation.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"


async def _cancel_as_result_arrives(wait: object) -> str:
    """Cancel a task waiting (through `wait`) on a future that completes in the same tick."""
    fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(wait(fut))  # type: ignore[operator]
    await asyncio.sleep(0)  # the task is now parked on the future
    fut.set_result("renewed")
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for was rewritten in 3.12")
async def test_wait_for_loses_a_cancel_that_races_its_result() -> None:
    async def via_wait_for(fut: asyncio.Future[str]) -> str:
        return await asyncio.wait_for(fut, 10)

    assert await _cancel_as_result_arrives(via_wait_for) == "renewed"


async def test_timeout_keeps_a_cancel_that_races_its_result() -> None:
    async def via_timeout(fut: asyncio.Future[str]) -> str:
        async with asyncio.timeout(10):
            return await fut

    assert await _cancel_as_result_arrives(via_timeout) == "cancelled"


def test_no_service_code_uses_wait_for() -> None:
    offenders = [
        f"{path.relative_to(SERVICES.parent)}:{n}"
        for path in SERVICES.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\basyncio\.wait_for\(", line) and not line.lstrip().startswith("#")
    ]
    assert offenders == [], "use `async with asyncio.timeout(s):` instead"
