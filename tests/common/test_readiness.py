"""Readiness: health reports NOT_SERVING for `readiness` and the service names while a
dependency is down (notify's PostgreSQL behind a proxy the test cuts; the lock service's
etcd stopped; upload's S3 store stopped) and SERVING again once it is back; liveness (the
empty service name) stays SERVING throughout; each transition is logged once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url
from support.services import ServiceProcess, service_process
from support.tcp_proxy import TcpProxy

from services.common.migrate import upgrade
from services.common.readiness import LIVENESS, READINESS
from services.notify import database as notify_db

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DEADLINE_S = 60.0
FAST_PROBES = {
    "SERENTAK_READINESS_INTERVAL_SECONDS": "0.2",
    "SERENTAK_READINESS_TIMEOUT_SECONDS": "2",
}


class Watcher:
    """A Health/Watch stream on one service name; `expect` reads until a status shows."""

    def __init__(self, channel: grpc.Channel, service: str) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        self._updates: Iterator[health_pb2.HealthCheckResponse] = stub.Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE_S * 4
        )

    def expect(self, status: int) -> None:
        for update in self._updates:
            if update.status == status:
                return
        raise AssertionError(f"health never reported {status}")


def check(channel: grpc.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def transitions(svc: ServiceProcess) -> list[dict]:
    """The service's `readiness_changed` log events, in order."""
    events = []
    for line in svc.log_text().splitlines():
        if '"readiness_changed"' in line:
            events.append(json.loads(line))
    return events


def assert_down_then_up(svc: ServiceProcess, cut, restore, service_name: str, probe: str) -> None:
    with grpc.insecure_channel(svc.address) as channel:
        readiness, named = Watcher(channel, READINESS), Watcher(channel, service_name)
        readiness.expect(SERVING)
        named.expect(SERVING)
        cut()
        readiness.expect(NOT_SERVING)
        named.expect(NOT_SERVING)
        assert check(channel, LIVENESS) == SERVING, "liveness must not follow a dependency"
        restore()
        readiness.expect(SERVING)
        named.expect(SERVING)
        assert check(channel, LIVENESS) == SERVING
    events = transitions(svc)
    assert [e["ready"] for e in events] == [True, False, True], events
    assert probe in events[1]["failing"]


@pytest.mark.postgres
@pytest.mark.slow
def test_notify_not_ready_while_its_database_is_unreachable(postgres, tmp_path: Path) -> None:
    url = postgres.create()
    upgrade(url, notify_db.migration_locations())
    real = make_url(url)
    with TcpProxy(real.host or "127.0.0.1", real.port or 5432) as proxy:
        proxied = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        env = {
            **FAST_PROBES,
            "SERENTAK_NOTIFY_DATABASE_URL": proxied,
            "SERENTAK_MIGRATE_ON_START": "false",
        }
        with service_process("notify", tmp_path, env) as svc:
            assert_down_then_up(
                svc, proxy.cut, proxy.restore, "serentak.notify.v1.NotifyService", "database"
            )


@pytest.mark.etcd
@pytest.mark.slow
def test_locks_not_ready_while_etcd_is_down(etcd_factory, tmp_path: Path) -> None:
    server = etcd_factory()
    env = {**FAST_PROBES, "SERENTAK_ETCD_ENDPOINTS": server.endpoint}
    with service_process("locks", tmp_path, env) as svc:
        assert_down_then_up(svc, server.stop, server.start, "serentak.locks.v1.LockService", "etcd")


@pytest.mark.slow
def test_upload_not_ready_while_its_blob_store_is_down(s3_factory, tmp_path: Path) -> None:
    store = s3_factory()
    env = {**FAST_PROBES, **store.env()}
    with service_process("upload", tmp_path, env) as svc:
        assert_down_then_up(
            svc, store.stop, store.start, "serentak.upload.v1.UploadService", "blob_store"
        )
