"""Pings on checkout, only for a pooled connection idle long enough to have been dropped.

SQLAlchemy's `pool_pre_ping` pings on every checkout: one round trip a transaction, which
every small file's commit and each of the outbox relay's transactions pays on PostgreSQL.
A connection checked in a moment ago was answering then. HikariCP skips its alive check
within 500 ms of a connection's last use (`aliveBypassWindowMs`) for the same reason; so
does this, with the same default.

What the window gives up: a connection the server dropped within it (a restart,
`pg_terminate_backend`) is found dead by the transaction's first statement instead of by
the ping. That transaction fails with a lost connection (`db.is_disconnect`, answered
UNAVAILABLE), where the ping would have replaced it first. The transactions running when a
server restarts fail either way. Once one connection of the pool is found lost (by a
statement or a ping: it is invalidated), every other is pinged at its next checkout until
it has been used again: the server that dropped one has likely dropped them all, and a
retry must not meet the next dead one.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import InvalidatePoolError

# Seconds since a connection's last use within which it is not pinged (HikariCP's default).
ALIVE_WINDOW_S = 0.5
# connection record's info: when the connection was last checked in (or connected).
_USED_AT = "serentak.used_at"


def ping_when_idle(engine: Engine, window_s: float = ALIVE_WINDOW_S) -> None:
    """Ping each connection `engine`'s pool checks out that was last used `window_s` or
    more ago, or before another was found lost (module docstring); one found lost is
    replaced, with the pool's older ones, as SQLAlchemy's pre-ping does. For an engine made
    with `pool_pre_ping=False`."""

    lost_at = [0.0]  # when a connection of the pool was last found lost

    @event.listens_for(engine, "invalidate")
    def invalidated(_dbapi: Any, _record: Any, _exc: Any) -> None:
        lost_at[0] = time.monotonic()

    @event.listens_for(engine, "connect")
    def connected(_dbapi: Any, record: Any) -> None:
        record.info[_USED_AT] = time.monotonic()

    @event.listens_for(engine, "checkin")
    def checked_in(_dbapi: Any, record: Any) -> None:
        if record is not None:
            record.info[_USED_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def checked_out(dbapi: Any, record: Any, _proxy: Any) -> None:
        used = record.info.get(_USED_AT)
        if used is not None and used > lost_at[0] and time.monotonic() - used < window_s:
            return
        dialect = engine.dialect
        try:
            dialect.do_ping(dbapi)
        except dialect.loaded_dbapi.Error as exc:
            if dialect.is_disconnect(exc, dbapi, None):
                raise InvalidatePoolError() from exc
            raise
