"""The CLI's tests run it as a subprocess against the `stack` (tests/client/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def database_url(tmp_path) -> str:
    """SQLite only: the CLI is a client; the server paths it uses are tested on both DBs."""
    return f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
