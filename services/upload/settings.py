"""Settings of the upload service."""

from __future__ import annotations

from pydantic import Field

from services.common.config import CommonSettings, sqlite_url


class UploadSettings(CommonSettings):
    """Read once at start-up from `SERENTAK_*`."""

    upload_database_url: str | None = Field(
        None, description="SQLAlchemy URL; default: SQLite at {data_dir}/upload.db."
    )

    @property
    def database_url(self) -> str:
        """The configured database, or the embedded SQLite default."""
        return self.upload_database_url or sqlite_url(self.data_dir, "upload")
