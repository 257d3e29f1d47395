"""Fixtures for the notify tests: the service running in-process on a fresh database
(SQLite and PostgreSQL, via `database_url`), called over real gRPC."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from notify.harness import NotifyHarness, start_notify

from services.common.config import DEFAULT_AUTH_TOKENS
from services.notify.settings import NotifySettings

# Importing the job runtime package first avoids an import cycle (outbox <-> jobs) in the
# runtime's migration env while that code is in progress; harmless once it is fixed.
with contextlib.suppress(ImportError):
    import services.common.jobs  # noqa: F401


@pytest.fixture
def notify_factory(database_url: str, tmp_path: Path) -> Callable[..., Any]:
    """Start the notify service on the test's database with settings overrides."""

    def make(**overrides: Any) -> Any:
        tokens = dict(DEFAULT_AUTH_TOKENS)
        for user in overrides.pop("extra_users", ()):
            tokens[f"tok-{user}"] = {"tenant_id": "acme", "user_id": user}
        settings = NotifySettings(
            notify_database_url=database_url,
            data_dir=tmp_path,
            auth_tokens=tokens,
            **overrides,
        )
        return start_notify(settings)

    return make


@pytest.fixture
async def notify(notify_factory: Callable[..., Any]) -> AsyncIterator[NotifyHarness]:
    """The notify service with default settings."""
    async with notify_factory() as harness:
        yield harness
