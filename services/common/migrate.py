"""Apply Alembic migrations programmatically.

Each service keeps its own migration folder (`services/<name>/migrations`) and version
table, so two services can share one PostgreSQL database without stepping on each other.
The job runtime's tables have their own folder too, applied before the service's.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url

from services.common.db import sync_url
from services.common.private_files import private_sqlite


def alembic_config(url: str, script_location: Path, version_table: str) -> Config:
    """An Alembic config for one migration folder against `url`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.set_main_option("sqlalchemy.url", sync_url(url).replace("%", "%%"))
    cfg.set_main_option("version_table", version_table)
    return cfg


def upgrade(url: str, locations: list[tuple[Path, str]]) -> None:
    """Upgrade `url` to head for each (migration folder, version table), in order."""
    if url.startswith("sqlite"):
        db_path = make_url(url).database
        if db_path and db_path != ":memory:":
            # 0600 in a 0700 folder (WAL/SHM follow the database file's mode).
            private_sqlite(Path(db_path))
    for location, version_table in locations:
        command.upgrade(alembic_config(url, location, version_table), "head")
