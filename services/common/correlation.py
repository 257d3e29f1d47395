"""The correlation id of the work in progress, carried in a context variable.

It arrives as `x-correlation-id` gRPC metadata (or is generated), is bound to every log
line through structlog's contextvars, and is copied into outbox rows, jobs and locks. The
variable is the client package's (`serentak.correlation`), so the calls a service makes
with it (the lock client) carry the id of the work they serve.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import structlog
from serentak.correlation import METADATA_KEY, current_correlation_id, new_correlation_id
from serentak.correlation import correlation_id as _current

_MAX_LEN = 128


def sanitize(value: str | None) -> str | None:
    """Keep a client-sent id only if it is short printable ASCII; else None."""
    if not value or len(value) > _MAX_LEN or not value.isascii() or not value.isprintable():
        return None
    return value


def usable(correlation_id: str | None) -> str:
    """`correlation_id` if `sanitize` keeps it, else a new one: the id to work under."""
    return sanitize(correlation_id) or new_correlation_id()


def bound_or_none() -> str | None:
    """The id bound for the work in progress, or None (nothing generated)."""
    return _current.get()


@contextlib.contextmanager
def bound_correlation_id(correlation_id: str | None) -> Iterator[str]:
    """Bind `correlation_id` (or a new one) for the duration of the block."""
    cid = usable(correlation_id)
    token = _current.set(cid)
    with structlog.contextvars.bound_contextvars(correlation_id=cid):
        try:
            yield cid
        finally:
            _current.reset(token)


def bind_for_call(correlation_id: str | None) -> str:
    """Bind `correlation_id` (or a new one) for the rest of the current task, with no reset.

    For streaming RPCs: their handler is an async generator, and when the client cancels,
    the generator may be closed from another task (the event loop's async-generator
    finalizer), where resetting a ContextVar token raises "was created in a different
    Context". grpc.aio runs every RPC in a task of its own, so its context dies with it and
    nothing needs resetting.
    """
    cid = usable(correlation_id)
    _current.set(cid)
    structlog.contextvars.bind_contextvars(correlation_id=cid)
    return cid


__all__ = [
    "METADATA_KEY",
    "bind_for_call",
    "bound_correlation_id",
    "bound_or_none",
    "current_correlation_id",
    "new_correlation_id",
    "sanitize",
]
