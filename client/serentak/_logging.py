"""Log events of the client: a stable snake_case name and keyword fields.

Inside the server, where structlog is configured, these are structlog events and come out
as the services' own JSON lines. Anywhere else (a client alone, or structlog installed but
not configured) they go through the standard library's `logging`, to the logger named
after the module: `lock_lost lock_key=file:1 lock_token=7 ...`. The choice is made at each
event, since the server configures structlog after importing this package.
"""

from __future__ import annotations

import logging
import sys
from typing import Any


class EventLogger:
    """`log.warning("lock_lost", lock_key=...)`: an event name and its fields."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._stdlib = logging.getLogger(name)

    def _emit(self, level: int, event: str, fields: dict[str, Any]) -> None:
        structlog = sys.modules.get("structlog")
        if structlog is not None and structlog.is_configured():
            structlog.get_logger(self._name).log(level, event, **fields)
        elif self._stdlib.isEnabledFor(level):
            text = " ".join(f"{k}={v}" for k, v in fields.items())
            self._stdlib.log(level, "%s %s", event, text, extra={"event_fields": fields})

    def info(self, event: str, **fields: Any) -> None:
        """An informational event."""
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Something the caller should know went wrong (and was handled)."""
        self._emit(logging.WARNING, event, fields)


def get_logger(name: str) -> EventLogger:
    """The event logger of module `name`."""
    return EventLogger(name)
