"""Group commit: units of work that arrive together share one transaction.

A group's units run one after another in one transaction, and its COMMIT answers them all:
a unit's answer comes only after that COMMIT, so its effect is durable when its caller
hears of it. One flusher task per committer runs the groups; while a group commits, the
next gathers (at most `max_group` units).

A unit that fails (a refusal, a constraint) gets its own error while the others commit:
- First try: no savepoints. The units run straight in the transaction; the first one that
  fails rolls the whole transaction back, gets its error, and the rest of the group runs
  again, this time each unit in a SAVEPOINT of its own (and so do the next
  `CAREFUL_GROUPS` groups: refusals come in runs). Failures are rare and a savepoint costs
  two statements a unit (round trips, on PostgreSQL), so the common case pays none.
- So a unit may run more than once, each time in a transaction that then rolls back
  but the last: a unit's work must be the same when run again (its effects outside the
  transaction kept idempotent).
- The error a unit gets is the one it met after the units before it in the group, as in
  its own transaction after theirs.

A unit that is in no hurry (bookkeeping: the outbox relay's) may wait for company: it
starts no group of its own, but goes with the next unit's, or alone once its wait is over.

Why: on SQLite every transaction takes the one write lock, and connections waiting for it
sleep in SQLite's busy handler (1..100 ms steps) instead of being woken; with many small
writes in flight, the waits, not the work, set the pace. A committer hands the lock from
unit to unit inside one transaction and pays one WAL fsync (one PostgreSQL commit round
trip) per group.

Locks: the units of a group run in the order their callers name (`order`: what a unit
locks, coarsest first), so groups on two replicas take row and advisory locks in one global
order and cannot deadlock on each other. A unit of a shared transaction may take a lock
after others' writes (`shares_transaction`): the order is the group's.

What a unit writes that nothing in the transaction reads back (outbox events, change log
and audit rows, folder bumps) is written behind: once a kind for the group, before its
COMMIT (`write_behind`); in a savepoint, the unit's own before the savepoint ends. If the
group's writes behind fail, its units run again, each in a savepoint. A unit that writes
only behind may declare what it reads (`reads`): the first of a run of such units then
reads it for them all (`group_reads`).

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

from services.common import group_reads, write_behind
from services.common.errors import Unavailable
from services.common.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")

# After a group whose unit failed, the next this many groups (of more than one unit) run
# their units in savepoints at once.
CAREFUL_GROUPS = 8
# session.info: set while the session's transaction is shared by a group's units.
_SHARED = "serentak.group_commit.shared"


def shares_transaction(session: AsyncSession) -> bool:
    """Whether `session`'s transaction is shared by several units of a group commit (a unit
    may then take a lock after the other units' writes: the group orders them)."""
    return bool(session.info.get(_SHARED))


class _Undo(Exception):
    """Rolls back a group's transaction whose unit failed (first try, no savepoints)."""


@dataclass(eq=False)
class _Unit(Generic[T]):
    work: Callable[[AsyncSession], Awaitable[T]]
    future: asyncio.Future[T]
    order: tuple[str, ...] = ()
    # Waiting for company (`run`'s `wait_for_company`): not a reason to start a group yet.
    waiting: bool = False
    # What the unit will read, declared so that its group reads it for a run of such
    # units at once (`group_reads`): {reader: key}, or None.
    reads: group_reads.Declared | None = None
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
        self._on_group = on_group  # told how many units each COMMIT stored (a metric)
        self._queue: deque[_Unit[Any]] = deque()
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        # Groups still to run in savepoints after a failed unit (CAREFUL_GROUPS).
        self._careful = 0

    async def run(
        self,
        work: Callable[[AsyncSession], Awaitable[T]],
        order: tuple[str, ...] = (),
        *,
        wait_for_company: float = 0.0,
        reads: group_reads.Declared | None = None,
    ) -> T:
        """Run `work(session)` in the next group's transaction; its result once that
        transaction has committed, or its error (or the COMMIT's).

        `order`: what the unit locks, coarsest first (e.g. tenant, folder). A group runs its
        units in that order, so two replicas' groups take their locks in one global order
        and never deadlock on each other.

        `wait_for_company`: seconds the unit may wait for another unit to commit with
        (bookkeeping that is in no hurry: it then costs no COMMIT of its own); after them it
        commits alone.

        `reads`: {reader: key}, what the unit will read through `group_reads.read`; such
        a unit writes only behind (`write_behind`), so its group may read for it together
        with the next units (`group_reads`)."""
        if self._closed:
            raise Unavailable("the service is shutting down; retry")
        loop = asyncio.get_running_loop()
        unit: _Unit[T] = _Unit(
            work, loop.create_future(), order, waiting=wait_for_company > 0, reads=reads
        )
        self._queue.append(unit)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_forever(), name="group-commit")
        if unit.waiting:
            loop.call_later(wait_for_company, self._waited, unit)
        else:
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

    def _waited(self, unit: _Unit[Any]) -> None:
        """`unit` waited for company long enough: it starts a group now."""
        unit.waiting = False
        self._wake.set()

    async def _flush_forever(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            # Units only waiting for company do not start a group; any other unit does
            # (and takes them along).
            while any(not unit.waiting for unit in self._queue):
                group = [self._queue.popleft() for _ in range(min(len(self._queue), self._max))]
                group.sort(key=lambda unit: unit.order)
                await self._commit(group)

    async def _commit(self, group: list[_Unit[Any]]) -> None:
        if len(group) == 1:
            await self._commit_alone(group[0])
            return
        if self._careful:
            self._careful -= 1
            await self._commit_in_savepoints(group)
            return
        failed = await self._commit_straight(group)
        if failed is None:
            return
        unit, error = failed
        if unit is not None:
            unit.settle(error=error)
        # else: the writes behind failed, whose unit's own savepoint will tell.
        self._careful = CAREFUL_GROUPS
        rest = [other for other in group if other is not unit and not other.future.done()]
        if len(rest) == 1:
            await self._commit_alone(rest[0])
        elif rest:
            await self._commit_in_savepoints(rest)

    async def _commit_straight(
        self, group: list[_Unit[Any]]
    ) -> tuple[_Unit[Any] | None, Exception] | None:
        """The group's units with no savepoints: None once they are committed (or the
        COMMIT failed them all), else the first unit that failed and its error (no unit:
        the writes behind failed), with nothing of the group stored."""
        done: list[tuple[_Unit[Any], Any]] = []
        failed: tuple[_Unit[Any] | None, Exception] | None = None
        try:
            async with self._sessions.begin() as session:
                session.info[_SHARED] = True
                write_behind.behind(session)
                group_reads.declare(session, [unit.reads for unit in group])
                for index, unit in enumerate(group):
                    group_reads.running(session, index)
                    try:
                        result = await _run_in_context(unit, session)
                    except Exception as exc:
                        failed = (unit, exc)
                        raise _Undo from exc
                    done.append((unit, result))
                try:
                    await write_behind.flush(session)
                except Exception as exc:
                    failed = (None, exc)
                    raise _Undo from exc
        except _Undo:
            return failed
        except BaseException as exc:
            self._fail(group, exc)
            return None
        self._on_group(len(group))
        for unit, result in done:
            unit.settle(result)
        return None

    async def _commit_in_savepoints(self, group: list[_Unit[Any]]) -> None:
        """The group's units, each in a savepoint: a failing one is rolled back alone."""
        done: list[tuple[_Unit[Any], Any]] = []
        try:
            async with self._sessions.begin() as session:
                session.info[_SHARED] = True
                write_behind.behind(session)
                for unit in group:
                    try:
                        async with session.begin_nested():
                            # In the caller's context: its correlation id in every log line.
                            result = await _run_in_context(unit, session)
                            await write_behind.flush(session)  # the unit's, in its savepoint
                    except Exception as exc:
                        write_behind.discard(session)
                        unit.settle(error=exc)  # its savepoint is rolled back
                        continue
                    done.append((unit, result))
        except BaseException as exc:
            self._fail(group, exc)
            return
        if done:
            self._on_group(len(done))
        for unit, result in done:
            unit.settle(result)

    def _fail(self, group: list[_Unit[Any]], exc: BaseException) -> None:
        """The transaction (its COMMIT, or the flusher cut short) failed every unit."""
        failure = exc if isinstance(exc, Exception) else Unavailable(f"commit cut: {exc!r}")
        for unit in group:
            unit.settle(error=failure)
        if not isinstance(exc, Exception):
            raise exc
        log.warning("group_commit_failed", units=len(group), error=repr(exc)[:500])

    async def _commit_alone(self, unit: _Unit[Any]) -> None:
        """A group of one: its failure is the transaction's, so no savepoint."""
        try:
            async with self._sessions.begin() as session:
                write_behind.behind(session)
                result = await _run_in_context(unit, session)
                await write_behind.flush(session)
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
