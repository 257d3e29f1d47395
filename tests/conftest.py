"""Fixtures shared by every test: real etcd, real PostgreSQL, a real S3-compatible server
(s3s-fs), fresh databases.

When CI=true, a test that needs PostgreSQL, etcd or s3s-fs fails if they are absent; elsewhere
it is skipped with the reason, so a laptop without them can still run the unit tests.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from support.etcd import EtcdCluster, EtcdServer, etcd_binary
from support.postgres import PostgresDatabases
from support.process import LocalServer
from support.s3 import S3Server, s3s_binary

IN_CI = os.environ.get("CI", "").lower() == "true"
# Services built or started by tests upgrade their own fresh databases, as under `make run`
# (production runs `serentak-migrate` as a step instead; tests/common covers both).
os.environ.setdefault("SERENTAK_MIGRATE_ON_START", "true")
# Services refuse to start without an auth mode. The suite runs on loopback with the dev
# token tables (tests of jwt mode and of the refusal set their own settings explicitly);
# settings built in-process read this, and `service_process` passes it to children.
os.environ.setdefault("SERENTAK_AUTH_MODE", "dev")
PG_DSN_ENV = "SERENTAK_TEST_PG_DSN"
# A suite started in the background by a non-interactive shell inherits SIGINT ignored, and
# exec keeps it ignored in every child: the tests that Ctrl-C a CLI would then see it run on.
# A handled SIGINT here is reset to the default in children, as in an interactive shell.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _unavailable(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is required in CI but is not available")
    pytest.skip(f"{what} not available")


S3S_FS = "s3s-fs (cargo install --locked s3s-fs@0.14.1 --features binary)"
ServerT = TypeVar("ServerT", bound=LocalServer)


def _session_server(make: Callable[[], ServerT]) -> Iterator[ServerT]:
    server = make()
    server.start()
    yield server
    server.stop()


def _server_factory(make: Callable[[int], ServerT]) -> Iterator[Callable[[], ServerT]]:
    """Yield a function that starts another server (`make(n)` builds the n-th); stops them
    all at teardown."""
    started: list[ServerT] = []

    def start() -> ServerT:
        server = make(len(started))
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One real etcd for the whole session (tests must use their own key prefixes)."""
    if etcd_binary() is None:
        _unavailable("etcd")
    yield from _session_server(lambda: EtcdServer(tmp_path_factory.mktemp("etcd") / "data"))


@pytest.fixture
def etcd_factory(tmp_path: Path) -> Iterator[Callable[[], EtcdServer]]:
    """Start private etcd servers (for tests that stop, kill or restart etcd)."""
    if etcd_binary() is None:
        _unavailable("etcd")
    yield from _server_factory(lambda n: EtcdServer(tmp_path / f"etcd{n}"))


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A fresh 3-member etcd cluster over TLS (client certificates) with auth enabled."""
    if etcd_binary() is None:
        _unavailable("etcd")
    cluster = EtcdCluster(tmp_path / "etcd-cluster", n=3, tls=True, auth=True)
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One real S3-compatible server (s3s-fs) for the session; tests use their own prefixes
    (`s3.blob_url()` / `s3.upload_settings()` make a fresh one each call)."""
    if s3s_binary() is None:
        _unavailable(S3S_FS)
    yield from _session_server(lambda: S3Server(tmp_path_factory.mktemp("s3") / "root"))


@pytest.fixture
def s3_factory(tmp_path: Path) -> Iterator[Callable[[], S3Server]]:
    """Start private S3 servers (for tests that stop, kill or restart one)."""
    if s3s_binary() is None:
        _unavailable(S3S_FS)
    yield from _server_factory(lambda n: S3Server(tmp_path / f"s3-{n}"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresDatabases]:
    """The PostgreSQL server named by SERENTAK_TEST_PG_DSN (an admin DSN)."""
    dsn = os.environ.get(PG_DSN_ENV)
    if not dsn:
        _unavailable(f"PostgreSQL ({PG_DSN_ENV} unset)")
    assert dsn is not None
    databases = PostgresDatabases(dsn)
    try:
        databases.check()
    except Exception as exc:
        _unavailable(f"PostgreSQL at {dsn} ({exc})")
    yield databases
    databases.drop_all()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: every DB test runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'test.db'}"
    databases: PostgresDatabases = request.getfixturevalue("postgres")
    return databases.create()
