"""Schema migrations as a step: upgrade under a lock, or check before serving.

Each service keeps its own migration folder (`services/<name>/migrations`) and version
table, so two services can share one PostgreSQL database without stepping on each other.
The job runtime's tables have their own folder too, applied before the service's.

Two ways a replica meets its schema (`SERENTAK_MIGRATE_ON_START`):
- true (`make run`, tests): `upgrade()` at start. On PostgreSQL the whole upgrade runs
  under one session-level advisory lock (`MIGRATION_LOCK_KEY`), so replicas starting
  together take turns: the first upgrades, the others find the schema at head.
- false (the default, production): run `serentak-migrate upload|notify|all` (or
  `python -m services.migrate ...`) as a deployment step; a replica only checks
  (`require_current()`) and refuses to start on a schema older than its code
  (`SchemaOutdated`, naming the command). A schema *newer* than the code (a revision the
  code does not know: rolling upgrade, migrations are additive) is served with a warning.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Connection, make_url

from services.common.db import is_sqlite, sync_url
from services.common.logging import get_logger
from services.common.private_files import private_sqlite

log = get_logger(__name__)

# pg_advisory_lock key every Serentak migrator takes (arbitrary, fixed forever).
MIGRATION_LOCK_KEY = 0x5E7E_7A4B


class SchemaOutdated(Exception):
    """The database's schema is older than this code: migrate before serving."""

    def __init__(self, service: str, behind: Sequence[str]) -> None:
        self.service = service
        self.behind = list(behind)
        super().__init__(
            f"the {service} database schema is older than this code ({'; '.join(behind)}). "
            f"Run `serentak-migrate {service}` (python -m services.migrate {service}) "
            "first, or set SERENTAK_MIGRATE_ON_START=true to migrate at start-up."
        )


@dataclass(frozen=True, slots=True)
class Expected:
    """What the code expects of one migration folder: its head and every known revision."""

    version_table: str
    head: str
    known: frozenset[str]


def alembic_config(url: str, script_location: Path, version_table: str) -> Config:
    """An Alembic config for one migration folder against `url`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.set_main_option("sqlalchemy.url", sync_url(url).replace("%", "%%"))
    cfg.set_main_option("version_table", version_table)
    return cfg


def expected(locations: Sequence[tuple[Path, str]]) -> list[Expected]:
    """The head and known revisions of each (migration folder, version table)."""
    out = []
    for location, version_table in locations:
        script = ScriptDirectory(str(location))
        head = script.get_current_head()
        assert head is not None, f"{location} has no single head"
        known = frozenset(rev.revision for rev in script.walk_revisions())
        out.append(Expected(version_table, head, known))
    return out


def behind(current: Mapping[str, str | None], expectations: Sequence[Expected]) -> list[str]:
    """Why the schema is older than the code ([] when it is not): one line per folder."""
    reasons = []
    for exp in expectations:
        rev = current.get(exp.version_table)
        if rev == exp.head or (rev is not None and rev not in exp.known):
            continue  # at head, or newer than this code (served: migrations are additive)
        reasons.append(f"{exp.version_table} at {rev or 'nothing'}, code needs {exp.head}")
    return reasons


def read_versions(conn: Connection, tables: Sequence[str]) -> dict[str, str | None]:
    """The revision recorded in each version table (None when the table is missing)."""
    out: dict[str, str | None] = {}
    inspector = inspect(conn)
    for table in tables:
        out[table] = (
            conn.execute(text(f"SELECT version_num FROM {table}")).scalar()
            if inspector.has_table(table)
            else None
        )
    return out


def current_versions(url: str, tables: Sequence[str]) -> dict[str, str | None]:
    """`read_versions` on a short-lived blocking connection to `url`."""
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            return read_versions(conn, tables)
    finally:
        engine.dispose()


@contextlib.contextmanager
def migration_lock(url: str) -> Iterator[None]:
    """Hold Serentak's migration advisory lock on PostgreSQL (nothing on SQLite)."""
    if is_sqlite(url):
        yield
        return
    conninfo = make_url(sync_url(url)).set(drivername="postgresql")
    with psycopg.connect(conninfo.render_as_string(hide_password=False), autocommit=True) as conn:
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (MIGRATION_LOCK_KEY,)).fetchone()
        if not (got and got[0]):
            log.info("migration_lock_waiting")
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


def upgrade(url: str, locations: list[tuple[Path, str]]) -> None:
    """Upgrade `url` to head for each (migration folder, version table), in order, under
    the migration lock; logs what moved."""
    if is_sqlite(url):
        db_path = make_url(url).database
        if db_path and db_path != ":memory:":
            # 0600 in a 0700 folder (WAL/SHM follow the database file's mode).
            private_sqlite(Path(db_path))
    tables = [table for _, table in locations]
    with migration_lock(url):
        before = current_versions(url, tables)
        for location, version_table in locations:
            command.upgrade(alembic_config(url, location, version_table), "head")
        after = current_versions(url, tables)
    for table in tables:
        if before[table] != after[table]:
            log.info(
                "schema_migrated", version_table=table, before=before[table], after=after[table]
            )


def require_current(service: str, url: str, locations: list[tuple[Path, str]]) -> None:
    """Raise `SchemaOutdated` when `url`'s schema is older than this code."""
    expectations = expected(locations)
    current = current_versions(url, [e.version_table for e in expectations])
    reasons = behind(current, expectations)
    if reasons:
        raise SchemaOutdated(service, reasons)
    newer = [e.version_table for e in expectations if current[e.version_table] not in e.known]
    if newer:
        log.warning("schema_newer_than_code", version_tables=newer)


def prepare_schema(
    service: str, url: str, locations: list[tuple[Path, str]], *, migrate_on_start: bool
) -> None:
    """At a replica's start: upgrade (when `migrate_on_start`) or require the schema at head."""
    if migrate_on_start:
        upgrade(url, locations)
    else:
        require_current(service, url, locations)


ServiceDatabase = Callable[[], tuple[str, list[tuple[Path, str]]]]


def main(databases: Mapping[str, ServiceDatabase], argv: Sequence[str] | None = None) -> int:
    """`serentak-migrate SERVICE|all`: upgrade each named service's database to head.

    `databases` maps a service name to what gives its database URL (from the service's
    settings) and its migration folders; `services.migrate` names every service's.
    """
    from services.common.config import CommonSettings, load
    from services.common.logging import configure_logging

    parser = argparse.ArgumentParser(
        prog="serentak-migrate",
        description="Upgrade a service's database schema to this code's head (a deployment "
        "step; safe to run from several places at once on PostgreSQL).",
    )
    parser.add_argument("service", choices=[*databases, "all"])
    args = parser.parse_args(argv)
    common = load(CommonSettings)
    configure_logging("migrate", common.log_format, common.log_level)
    for service in databases if args.service == "all" else (args.service,):
        url, locations = databases[service]()
        upgrade(url, locations)
        require_current(service, url, locations)
        log.info("schema_current", migrated_service=service)
    return 0
