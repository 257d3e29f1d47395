"""One place that configures structured logs: JSON lines in production, console in dev.

Every line is an event with a stable snake_case name; ids (correlation_id, file_id, ...)
are bound through contextvars or passed as keys, never formatted into the message.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(
    service: str, fmt: str = "json", level: str = "INFO", *, once: bool = False
) -> None:
    """Configure structlog and the standard library to write one event per line to stderr.

    `once`: the process configures its logs this once (a service's `run_service`), so each
    logger is built on its first line and kept, not built again for every line (~12 us a
    line). Left off where logging may be configured again or captured (tests, tools)."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer()
    else:
        shared.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=once,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s", force=True)


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A logger for `name` (usually `__name__`)."""
    return structlog.get_logger(name)  # type: ignore[no-any-return]
