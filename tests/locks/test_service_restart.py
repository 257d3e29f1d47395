"""The lock service restarting under a holder: the LockClient re-attaches or reports loss."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from locks.principals import USER_TOKEN
from serentak.errors import LockLost
from serentak.locks.v1 import locks_pb2
from serentak.sdk.locks import LockClient
from support.ports import free_port
from support.services import REPO_ROOT, SUBPROCESS_PYTHONPATH, service_process, wait_serving

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


async def _until(condition, within: float) -> None:  # type: ignore[no-untyped-def]
    """Poll an observable condition with a deadline."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.05)


def _start_locks(port: int, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """`python -m services.locks` on a fixed port (so a restart keeps its address)."""
    full_env = {
        **os.environ,
        "PYTHONPATH": SUBPROCESS_PYTHONPATH,
        "SERENTAK_LOCKS_PORT": str(port),
        "SERENTAK_LOCKS_METRICS_PORT": "0",
        **env,
    }
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.locks"],
            cwd=REPO_ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_serving(f"127.0.0.1:{port}")
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


async def test_client_reattaches_after_a_quick_service_restart(etcd, tmp_path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    env = {"SERENTAK_ETCD_ENDPOINT": etcd.endpoint, "SERENTAK_LOCK_PREFIX": f"/t/restart-{port}/"}
    log_path = tmp_path / "locks.log"
    processes = [await asyncio.to_thread(_start_locks, port, env, log_path)]
    client = LockClient(f"127.0.0.1:{port}", owner="long-job", token=USER_TOKEN)
    try:
        async with client.hold("user:alice:r1", ttl=8) as lock:
            token = lock.token
            _stop(processes[0])  # SIGKILL: a crash, mid-hold
            processes.append(await asyncio.to_thread(_start_locks, port, env, log_path))
            await _until(lambda: lock.reattached >= 1, within=8)
            renewed_after = lock.lock.expires_at.ToSeconds()
            # The restarted service keeps renewing: expiry moves forward again.
            await _until(lambda: lock.lock.expires_at.ToSeconds() > renewed_after, within=8)
            assert lock.token == token and lock.lost is None
            state = await client.describe("user:alice:r1")
            assert state.lock.token == token
        state = await client.describe("user:alice:r1")
        assert not state.held
    finally:
        await client.close()
        for process in processes:
            _stop(process)


async def test_client_reports_loss_when_the_service_stays_away_longer_than_the_ttl(
    etcd, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    env = {"SERENTAK_ETCD_ENDPOINT": etcd.endpoint, "SERENTAK_LOCK_PREFIX": "/t/restart-gone/"}
    with service_process("locks", tmp_path, env) as svc:
        client = LockClient(svc.address, owner="long-job", token=USER_TOKEN)
        try:
            with pytest.raises(LockLost):
                async with client.hold("user:alice:r2", ttl=2) as lock:
                    svc.process.kill()
                    await asyncio.sleep(30)  # the body would run on; the loss cancels it
            assert lock.lost is not None
            assert lock.lost.reason == locks_pb2.LOST_REASON_ETCD_UNREACHABLE
        finally:
            await client.close()
