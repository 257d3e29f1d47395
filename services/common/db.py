"""SQLAlchemy 2 engines and sessions for SQLite (embedded default) and PostgreSQL.

SQLite runs in WAL mode and every transaction begins IMMEDIATE: a writer takes the write
lock up front, so two transactions never deadlock upgrading a read lock (which SQLite
reports as "database is locked" without waiting on the busy timeout). Pure reads may opt
out with `read_only(session)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite
from aiosqlite.core import _STOP_RUNNING_SENTINEL, set_exception, set_result
from sqlalchemy import MetaData, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from services.common.logging import get_logger
from services.common.pool_pings import ping_when_idle
from services.common.private_files import private_sqlite
from services.common.sqlite_cursor import OneHopCursor
from services.common.sqlite_writers import BEGIN_WRITE, WriterTurn

log = get_logger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
_READ_ONLY_OPTION = "serentak_read_only"

# Deterministic constraint names, so migrations can drop and alter them on both backends.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def new_metadata() -> MetaData:
    """A `MetaData` with Serentak's constraint naming convention (one per migration folder)."""
    return MetaData(naming_convention=NAMING_CONVENTION)


def sqlite_utc_text(value: datetime | None) -> str | None:
    """An aware datetime as SQLite stores it: naive UTC text, `YYYY-MM-DD HH:MM:SS.ffffff`,
    exactly as SQLAlchemy's SQLite DATETIME writes it (so text comparisons in SQL still
    order times), in one call where the type's own processors take ~8 us a value."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime: pass an aware UTC datetime")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def is_sqlite(url: str) -> bool:
    """True for a SQLite URL."""
    return make_url(url).get_backend_name() == "sqlite"


def async_url(url: str) -> str:
    """The async-driver form of a database URL (aiosqlite, psycopg)."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        return str(u.set(drivername="sqlite+aiosqlite"))
    if u.get_backend_name() == "postgresql":
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    raise ValueError(f"unsupported database: {u.get_backend_name()}")


def sync_url(url: str) -> str:
    """The blocking-driver form of a database URL (for Alembic and scripts)."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        return str(u.set(drivername="sqlite"))
    return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _configure_sqlite(engine: Any, synchronous: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (the driver's is deferred).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A read-only transaction (READ_ONLY) reads a WAL snapshot without the write lock,
        # so a slow reader never holds up writers; anything that may write goes IMMEDIATE.
        if conn.get_execution_options().get(_READ_ONLY_OPTION):
            conn.exec_driver_sql("BEGIN")
        else:
            # Preceded by the connection's writer turn (`sqlite_writers`, `OneHopCursor`).
            conn.exec_driver_sql(BEGIN_WRITE)


class _SqliteConnection(aiosqlite.Connection):
    """aiosqlite's connection with a `close()` that is safe after a terminate.

    aiosqlite 0.22.1's `close()` always queues a stop for its worker thread and awaits it.
    When SQLAlchemy has already terminated the connection (`stop()`: a statement cancelled
    mid-flight, e.g. a background loop at shutdown), the thread is gone or leaving, that
    await never returns, and the event loop's shutdown hangs on it forever.
    """

    def __init__(self, path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._thread = threading.Thread(target=_worker, args=(self._tx,), daemon=True)
        self.writer_turn = WriterTurn(path)

    @property
    def writes_inline(self) -> bool:
        """True while this connection holds its write transaction's turn (below)."""
        return self.writer_turn.held

    async def begin_write(self) -> None:
        """BEGIN IMMEDIATE, in this process's turn (`sqlite_writers`): on the event loop's
        thread when no other process holds the write lock, the usual case (`_begin_now`);
        else on the connection's thread, which waits for it in SQLite's busy handler."""
        await self.writer_turn.take(SQLITE_BUSY_TIMEOUT_MS / 1000)
        try:
            if not self._begin_now():
                await self._execute(self._conn.execute, BEGIN_WRITE)
        except BaseException:
            self.writer_turn.give_back()
            raise

    def _begin_now(self) -> bool:
        """Try BEGIN IMMEDIATE at once, on the calling thread, with SQLite's busy handler
        off for the try: True if it began; False if another process holds the write lock
        (nothing began). Saves the hand-off to the connection's thread and back, ~0.8 ms
        of a small file's commit measured with the loop busy; the lock's holder in this
        process is ruled out by the turn, so waiting is rare and stays off the loop."""
        conn = self._conn
        (waits_ms,) = conn.execute("PRAGMA busy_timeout").fetchone()
        conn.execute("PRAGMA busy_timeout=0")
        try:
            conn.execute(BEGIN_WRITE)
        except sqlite3.OperationalError as exc:
            # SQLITE_BUSY, or an extended code of it (SQLITE_BUSY_RECOVERY: another
            # process recovering the WAL): wait on the thread as for any busy lock.
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            return False
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(waits_ms)}")
        return True

    async def commit(self) -> None:
        """Commit the current transaction and end the writer turn."""
        try:
            await super().commit()
        finally:
            self.writer_turn.give_back()

    async def rollback(self) -> None:
        """Roll back the current transaction and end the writer turn."""
        try:
            await super().rollback()
        finally:
            self.writer_turn.give_back()

    def cursor(self) -> Any:  # SQLAlchemy's adapter: one hand-off a statement, not four
        """A cursor that executes, fetches and closes in one call on the thread."""
        return OneHopCursor(self)

    async def close(self) -> None:
        """Close the SQLite connection and stop the thread, unless already stopped."""
        if self._connection is None or not self._running:
            self.writer_turn.give_back()
            return
        try:
            await self._execute(_rollback_and_close, self._conn)
        finally:
            self.writer_turn.give_back()
            self._connection = None
            if self._running:  # nobody stopped the thread meanwhile: it will answer
                stopped: asyncio.Future[object] = asyncio.get_running_loop().create_future()
                self._queue_stop(stopped)
                await stopped

    def stop(self) -> None:
        """Stop the worker thread once what is queued has run, sending no answer.

        SQLAlchemy's terminate and aiosqlite's `__del__` call this and never await it;
        aiosqlite's own sent an answer to the current event loop, and when that loop had
        closed meanwhile (shutdown, a leaked connection collected later) the thread died
        on RuntimeError."""
        self._queue_stop(None)
        self.writer_turn.give_back()

    def _queue_stop(self, answer: asyncio.Future[object] | None) -> None:
        self._running = False

        def close_and_stop() -> object:
            if self._connection is not None:
                _rollback_and_close(self._connection)
                self._connection = None
            return _STOP_RUNNING_SENTINEL

        self._tx.put_nowait((answer, close_and_stop))


def _rollback_and_close(connection: sqlite3.Connection) -> None:
    """Close `connection`, rolling back its transaction first.

    Closing alone is not enough when a cursor's statement is still active: a statement
    that returns rows (INSERT .. RETURNING, a claim, a SELECT) whose await was cancelled
    before its rows were fetched. Python's sqlite3 (3.11 here) closes with
    `sqlite3_close_v2`, which leaves such a connection a "zombie" that keeps its
    transaction, and with it SQLite's write lock, until that cursor is garbage-collected;
    the cancelled task's traceback keeps it alive meanwhile, so every other writer waits
    out the busy timeout. A failed rollback still closes (as before, nothing more)."""
    if connection.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            connection.rollback()
    connection.close()


def _worker(queue: Any) -> None:
    """aiosqlite's worker loop, except that an answer nobody can receive is dropped.

    A statement still running when its event loop closed (a task abandoned at shutdown, or
    one waiting out the busy timeout behind another connection's write lock) finishes
    later; aiosqlite's own loop then raised RuntimeError in this thread and died, leaving
    every statement queued behind it unanswered. Dropping the answer is all there is to
    do: the awaiting task is gone with its loop. It is logged, naming the statement."""
    while True:
        answer, function = queue.get()
        try:
            result: Any = function()
        except BaseException as exc:  # handed to the awaiting task, as aiosqlite does
            _answer(answer, function, set_exception, exc)
            continue
        _answer(answer, function, set_result, result)
        if result is _STOP_RUNNING_SENTINEL:
            return


def _answer(answer: Any, function: Any, setter: Any, value: Any) -> None:
    if answer is None:
        return
    try:
        answer.get_loop().call_soon_threadsafe(setter, answer, value)
    except RuntimeError:  # the loop has closed
        log.warning("sqlite_answer_dropped", statement=repr(function)[:500])


async def connect_sqlite(path: str) -> aiosqlite.Connection:
    """An aiosqlite connection to `path` (what SQLAlchemy's dialect would open), whose
    close is safe after a terminate (`_SqliteConnection`)."""
    connection = _SqliteConnection(
        path, partial(sqlite3.connect, path, check_same_thread=False), iter_chunk_size=64
    )
    return await connection


def create_engine(
    url: str, *, sqlite_synchronous: str = "FULL", pool_size: int = 10, pre_ping: bool = True
) -> AsyncEngine:
    """An async engine for `url` with Serentak's SQLite/PostgreSQL settings.

    PostgreSQL connections idle for half a second or more are pinged on checkout (`pre_ping`,
    `pool_pings`) so a connection the server dropped (restart, idle timeout,
    `pg_terminate_backend`) is replaced before use: one round trip per such checkout. A
    caller that runs every transaction through a retry on `is_disconnect` may pass
    `pre_ping=False`: the first statement on a dropped connection then fails, SQLAlchemy
    replaces the pool's connections, and the retry runs on a fresh one."""
    if is_sqlite(url):
        path = make_url(url).database
        if path and path != ":memory:":
            private_sqlite(Path(path))  # before SQLite creates it 0644
        database = path or ":memory:"
        engine = create_async_engine(
            async_url(url), async_creator=partial(connect_sqlite, database)
        )
        _configure_sqlite(engine.sync_engine, sqlite_synchronous)
        return engine
    engine = create_async_engine(async_url(url), pool_size=pool_size, max_overflow=pool_size)
    if pre_ping:
        ping_when_idle(engine.sync_engine)
    return engine


def is_disconnect(exc: BaseException) -> bool:
    """True for a database error that means the connection was lost (SQLAlchemy has
    invalidated it): the transaction did not run or, if it failed at COMMIT, may have;
    only an idempotent transaction may be run again."""
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded attributes after commit (no lazy reload in async code)."""
    return async_sessionmaker(engine, expire_on_commit=False)


async def read_only(session: AsyncSession) -> AsyncSession:
    """Mark `session`'s transaction read-only before its first statement; returns it.

    On SQLite it then begins DEFERRED (a snapshot, no write lock): a statement that writes
    in it would fail, so use it only for pure reads. PostgreSQL readers never block
    writers anyway; there it runs in autocommit: at READ COMMITTED every statement reads
    its own snapshot inside a transaction or not, so a pure read saves the BEGIN and
    ROLLBACK round trips (two of a chunk's seven).
    """
    options: dict[str, Any] = {_READ_ONLY_OPTION: True}
    if session.get_bind().dialect.name == "postgresql":
        options["isolation_level"] = "AUTOCOMMIT"
    await session.connection(execution_options=options)
    return session


async def dispose_when_returned(engine: AsyncEngine, grace_seconds: float = 5.0) -> None:
    """Dispose of `engine`'s pool once every connection checked out of it is back.

    Why wait: a call cancelled at shutdown closes its session in a task of its own
    (SQLAlchemy shields the close), which may still be running when the server has
    stopped. Disposing then and ending the event loop right after leaves that close
    unfinished: the connection is never checked in, and the garbage collector terminates
    it later with a "non-checked-in connection" warning. After `grace_seconds` it
    disposes anyway and logs how many connections were still out."""
    pool = engine.sync_engine.pool
    checked_out = getattr(pool, "checkedout", None)
    if checked_out is None:  # StaticPool (in-memory SQLite), NullPool: they keep no count
        await engine.dispose()
        return
    returned = asyncio.Event()
    loop = asyncio.get_running_loop()

    def count() -> None:
        if checked_out() == 0:
            returned.set()

    def on_checkin(*_: object) -> None:
        # Counted on the loop, after the pool has taken the connection back (the event
        # fires just before), whichever thread checks it in (a finalizer too).
        loop.call_soon_threadsafe(count)

    event.listen(pool, "checkin", on_checkin)
    try:
        if checked_out() > 0:
            try:
                async with asyncio.timeout(grace_seconds):
                    await returned.wait()
            except TimeoutError:
                log.warning("db_connections_not_returned", checked_out=checked_out())
    finally:
        event.remove(pool, "checkin", on_checkin)
    await engine.dispose()
