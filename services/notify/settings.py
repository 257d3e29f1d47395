"""Settings of the notify service."""

from __future__ import annotations

from pydantic import Field

from services.common.config import CommonSettings, sqlite_url


class NotifySettings(CommonSettings):
    """Read once at start-up from `SERENTAK_*`."""

    notify_database_url: str | None = Field(
        None, description="SQLAlchemy URL; default: SQLite at {data_dir}/notify.db."
    )

    @property
    def database_url(self) -> str:
        """The configured database, or the embedded SQLite default."""
        return self.notify_database_url or sqlite_url(self.data_dir, "notify")
