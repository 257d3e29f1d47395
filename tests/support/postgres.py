"""Fresh PostgreSQL databases on a real server, named serentak_t_<random>."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from sqlalchemy.engine import make_url


class PostgresDatabases:
    """Creates throw-away databases from an admin DSN and drops them all at the end."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.created: list[str] = []

    def check(self) -> None:
        """Raise if the server does not answer."""
        with psycopg.connect(self.admin_dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")

    def create(self, icu_locale: str | None = None) -> str:
        """A new empty database; returns its SQLAlchemy URL. With `icu_locale` (e.g.
        "en-US"; PostgreSQL 15+), its default collation is that ICU locale's."""
        name = f"serentak_t_{uuid.uuid4().hex[:12]}"
        if icu_locale and self.server_version() < 150000:
            pytest.skip("an ICU default collation for a database needs PostgreSQL 15+")
        options = (
            f" TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '{icu_locale}'"
            if icu_locale
            else ""
        )
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{options}')
        self.created.append(name)
        url = make_url(self.admin_dsn).set(drivername="postgresql+psycopg", database=name)
        return url.render_as_string(hide_password=False)

    def server_version(self) -> int:
        """The server's version number (150018 for 15.18)."""
        with psycopg.connect(self.admin_dsn) as conn:
            row = conn.execute("SHOW server_version_num").fetchone()
        assert row is not None
        return int(row[0])

    def drop(self, *names: str, role: str | None = None) -> None:
        """Drop databases made elsewhere (a deployment guide's), then their owner `role`."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if role is not None:
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')

    def ssl_on(self) -> bool:
        """True when the server offers TLS (`ssl = on`)."""
        with psycopg.connect(self.admin_dsn) as conn:
            row = conn.execute("SHOW ssl").fetchone()
        return row is not None and row[0] == "on"

    def drop_all(self) -> None:
        """Drop every database this object created."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for name in self.created:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.clear()


def terminate_other_sessions(database_url: str) -> int:
    """Terminate every other session on `database_url`'s database, as a server restart
    would; how many were terminated."""
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)
