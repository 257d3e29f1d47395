"""The correlation id a call carries (`x-correlation-id` metadata), from a context variable.

A client that sets `correlation_id` (a ContextVar) for some work has every lock call made
within it carry that id; with none set, each call gets a fresh one. The server binds the
same variable while it handles a call (services.common.correlation), so what it calls on
behalf of a request carries the request's id.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar

METADATA_KEY = "x-correlation-id"

correlation_id: ContextVar[str | None] = ContextVar("correlation_id", default=None)


def new_correlation_id() -> str:
    """A fresh random id (32 hex characters)."""
    return uuid.uuid4().hex


def current_correlation_id() -> str:
    """The bound id, or a new one when nothing is bound."""
    return correlation_id.get() or new_correlation_id()
