"""Settings of the lock service."""

from __future__ import annotations

from pydantic import Field

from services.common.config import CommonSettings


class LocksSettings(CommonSettings):
    """Read once at start-up from `SERENTAK_*`."""

    lock_prefix: str = Field("/serentak/locks/", description="etcd key prefix for all locks.")
