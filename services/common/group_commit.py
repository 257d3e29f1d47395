"""Group commit: units of work that arrive together share one transaction.

Each unit runs in a SAVEPOINT of the group's transaction, so a unit that fails (a
refusal, a constraint) is rolled back alone and gets its own error while the others
commit. A unit's answer comes only after the group's COMMIT: its effect is durable when its
caller hears of it. One flusher task per committer runs the units of a group one after
another; while a group commits, the next gathers (at most `max_group` units).

Why: on SQLite every transaction takes the one write lock, and connections waiting for it
sleep in SQLite's busy handler (1..100 ms steps) instead of being woken; with many small
writes in flight, the waits, not the work, set the pace. A committer hands the lock from
unit to unit inside one transaction and pays one WAL fsync (one PostgreSQL commit round
trip) per group.

Locks: the units of a group run in the order their callers name (`order`: what a unit
locks, coarsest first), so groups on two replicas take row and advisory locks in one global
order and cannot deadlock on each other.

A COMMIT that fails fails every unit of the group that had succeeded, with that error:
nothing of the group is known to be stored. The flusher is nobody's task: a caller
cancelled while its unit runs does not roll the group back; one cancelled while still
queued is withdrawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.errors import Unavailable
from services.common.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")


@dataclass(eq=False)
class _Unit(Generic[T]):
    work: Callable[[AsyncSession], Awaitable[T]]
    future: asyncio.Future[T]
    order: tuple[str, ...] = ()
    context: contextvars.Context = field(default_factory=contextvars.copy_context)

    def settle(self, result: T | None = None, error: BaseException | None = None) -> None:
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)  # type: ignore[arg-type]


class GroupCommits:
    """Runs units of work in shared transactions (module docstring)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        max_group: int = 32,
        on_group: Callable[[int], None] = lambda size: None,
    ) -> None:
        self._sessions = sessions
        self._max = max_group
        self._on_group = on_group  # told each committed group's size (a metric)
        self._queue: deque[_Unit[Any]] = deque()
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    async def run(
        self, work: Callable[[AsyncSession], Awaitable[T]], order: tuple[str, ...] = ()
    ) -> T:
        """Run `work(session)` in a savepoint of the next group's transaction; its result
        once that transaction has committed, or its error (or the COMMIT's).

        `order`: what the unit locks, coarsest first (e.g. tenant, folder). A group runs its
        units in that order, so two replicas' groups take their locks in one global order
        and never deadlock on each other."""
        if self._closed:
            raise Unavailable("the service is shutting down; retry")
        unit: _Unit[T] = _Unit(work, asyncio.get_running_loop().create_future(), order)
        self._queue.append(unit)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_forever(), name="group-commit")
        self._wake.set()
        try:
            return await asyncio.shield(unit.future)
        except asyncio.CancelledError:
            if unit in self._queue:  # not started: withdrawn
                self._queue.remove(unit)
            raise

    async def close(self) -> None:
        """Stop taking units; queued ones fail UNAVAILABLE; the group under way finishes."""
        self._closed = True
        while self._queue:
            self._queue.popleft().settle(error=Unavailable("the service is shutting down; retry"))
        if self._flusher is not None:
            self._wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher

    async def _flush_forever(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                group = [self._queue.popleft() for _ in range(min(len(self._queue), self._max))]
                group.sort(key=lambda unit: unit.order)
                await self._commit(group)

    async def _commit(self, group: list[_Unit[Any]]) -> None:
        if len(group) == 1:
            await self._commit_alone(group[0])
            return
        done: list[tuple[_Unit[Any], Any]] = []
        try:
            async with self._sessions.begin() as session:
                for unit in group:
                    try:
                        async with session.begin_nested():
                            # In the caller's context: its correlation id in every log line.
                            result = await _run_in_context(unit, session)
                    except Exception as exc:
                        unit.settle(error=exc)  # its savepoint is rolled back
                        continue
                    done.append((unit, result))
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else Unavailable(f"commit cut: {exc!r}")
            for unit in group:
                unit.settle(error=failure)
            if not isinstance(exc, Exception):
                raise
            log.warning("group_commit_failed", units=len(group), error=repr(exc)[:500])
            return
        self._on_group(len(group))
        for unit, result in done:
            unit.settle(result)

    async def _commit_alone(self, unit: _Unit[Any]) -> None:
        """A group of one: its failure is the transaction's, so no savepoint."""
        try:
            async with self._sessions.begin() as session:
                result = await _run_in_context(unit, session)
        except BaseException as exc:
            unit.settle(error=exc if isinstance(exc, Exception) else Unavailable("commit cut"))
            if not isinstance(exc, Exception):
                raise
            return
        self._on_group(1)
        unit.settle(result)


async def _run_in_context(unit: _Unit[T], session: AsyncSession) -> T:
    return await asyncio.create_task(_call(unit.work, session), context=unit.context)


async def _call(work: Callable[[AsyncSession], Awaitable[T]], session: AsyncSession) -> T:
    return await work(session)
