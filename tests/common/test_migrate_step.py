"""Migrations as a deployment step: `serentak-migrate` upgrades a database; migrators
started together on PostgreSQL take turns under the advisory lock (one upgrades, the
others find head); a replica with SERENTAK_MIGRATE_ON_START=false refuses to start on a
schema older than its code, naming the command, and starts once it has run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from alembic import command
from sqlalchemy.engine import make_url
from support.services import REPO_ROOT, service_process

from services.common.migrate import (
    MIGRATION_LOCK_KEY,
    Expected,
    alembic_config,
    behind,
    current_versions,
    expected,
)
from services.notify import database as notify_db
from services.upload import database as upload_db

DEADLINE_S = 120.0


def _env(url: str) -> dict[str, str]:
    return {
        **os.environ,
        "SERENTAK_UPLOAD_DATABASE_URL": url,
        "SERENTAK_NOTIFY_DATABASE_URL": url,
        "SERENTAK_MIGRATE_ON_START": "false",
        "PYTHONPATH": str(REPO_ROOT),
    }


def _migrator(url: str, service: str, console_script: bool) -> subprocess.Popen[str]:
    script = Path(sys.executable).parent / "serentak-migrate"
    cmd = [str(script)] if console_script else [sys.executable, "-m", "services.migrate"]
    return subprocess.Popen(
        [*cmd, service],
        cwd=REPO_ROOT,
        env=_env(url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _at_head(url: str) -> bool:
    locations = upload_db.migration_locations() + notify_db.migration_locations()[1:]
    exps = expected(locations)
    return behind(current_versions(url, [e.version_table for e in exps]), exps) == []


def _advisory_waiters(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND objid = %s AND database = (SELECT oid FROM pg_database WHERE datname = "
        "current_database())",
        (MIGRATION_LOCK_KEY & 0xFFFFFFFF,),
    ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.postgres
@pytest.mark.slow
def test_racing_migrators_take_turns_under_the_advisory_lock(postgres) -> None:
    url = postgres.create()
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(libpq, autocommit=True) as holder:
        # Hold the lock so that all migrators are provably waiting at once, then let go.
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        procs = [_migrator(url, "all", console_script=i == 0) for i in range(3)]
        deadline = time.monotonic() + DEADLINE_S
        while _advisory_waiters(holder) < len(procs):
            assert time.monotonic() < deadline, "the migrators never all waited for the lock"
            assert all(p.poll() is None for p in procs), "a migrator ran without the lock"
            time.sleep(0.05)  # polling pg_locks for the state above, not a stand-in
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    outputs = [p.communicate(timeout=DEADLINE_S)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    joined = "\n".join(outputs)
    assert joined.count("migration_lock_waiting") >= len(procs)
    # Each version table moved once, by whichever migrator came first.
    for table in ("alembic_version_runtime", "alembic_version_upload", "alembic_version_notify"):
        moved = [o for o in outputs if f'"version_table": "{table}"' in o]
        assert len(moved) == 1, (table, outputs)
    assert _at_head(url)


def test_replica_refuses_an_old_schema_until_migrated(database_url: str, tmp_path) -> None:
    # The database as the previous release left it: notify one revision behind.
    for location, table in notify_db.migration_locations():
        target = "notify_0002" if table == notify_db.VERSION_TABLE else "head"
        command.upgrade(alembic_config(database_url, location, table), target)
    env = {"SERENTAK_NOTIFY_DATABASE_URL": database_url, "SERENTAK_MIGRATE_ON_START": "false"}
    refused = subprocess.run(
        [sys.executable, "-m", "services.notify"],
        cwd=REPO_ROOT,
        env={**_env(database_url), "SERENTAK_DATA_DIR": str(tmp_path / "data"), **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert refused.returncode != 0
    assert "schema_outdated" in refused.stderr
    assert "alembic_version_notify at notify_0002" in refused.stderr
    assert "serentak-migrate notify" in refused.stderr
    migrate = _migrator(database_url, "notify", console_script=True)
    out = migrate.communicate(timeout=DEADLINE_S)[0]
    assert migrate.returncode == 0, out
    assert "schema_migrated" in out
    (tmp_path / "svc").mkdir()
    with service_process("notify", tmp_path / "svc", env) as svc:
        assert "schema_outdated" not in svc.log_text()


def test_behind_names_older_folders_and_serves_newer_ones() -> None:
    exps = [
        Expected("v_a", "a2", frozenset({"a1", "a2"})),
        Expected("v_b", "b1", frozenset({"b1"})),
    ]
    assert behind({"v_a": "a2", "v_b": "b1"}, exps) == []
    assert behind({"v_a": "a1", "v_b": None}, exps) == [
        "v_a at a1, code needs a2",
        "v_b at nothing, code needs b1",
    ]
    # A revision the code does not know is newer (rolling upgrade): served.
    assert behind({"v_a": "a3", "v_b": "b1"}, exps) == []
