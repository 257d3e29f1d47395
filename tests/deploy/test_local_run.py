"""`make run`'s supervisor starts etcd and all three services, reports them, and on Ctrl-C
stops everything: no orphan process (etcd included) outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from support.etcd import etcd_binary
from support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def _processes_mentioning(fragment: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if fragment in cmdline or fragment in environ:
            pids.append(int(entry.name))
    return pids


def _tus_discovery(port: int) -> httpx.Response:
    """OPTIONS on the tus endpoint, once its listener (started with the service) is up."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return httpx.options(
                f"http://127.0.0.1:{port}/files/", headers={"Origin": "http://localhost:3000"}
            )
        except httpx.ConnectError:
            assert time.monotonic() < deadline, "the tus endpoint never listened"
            time.sleep(0.05)


def test_run_starts_everything_and_ctrl_c_leaves_no_orphans(tmp_path: Path) -> None:
    assert etcd_binary(), "etcd is needed"
    data_dir = tmp_path / "serentak-run-data"
    env = {
        **os.environ,
        "SERENTAK_DATA_DIR": str(data_dir),
        "SERENTAK_ETCD_ENDPOINT": f"127.0.0.1:{free_port()}",
        "PYTHONPATH": str(REPO_ROOT),
    }
    for name in ("upload", "locks", "notify"):
        port = free_port()
        env[f"SERENTAK_{name.upper()}_PORT"] = str(port)
        env[f"SERENTAK_{name.upper()}_ADDRESS"] = f"127.0.0.1:{port}"
        env[f"SERENTAK_{name.upper()}_METRICS_PORT"] = str(free_port())
    tus_port = free_port()
    env["SERENTAK_TUS_PORT"] = str(tus_port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.local.run"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # blocks on output, no sleeping
            seen.append(line)
            if "Ctrl-C stops everything" in line:
                break
        else:
            raise AssertionError("".join(seen[-50:]))
        assert _processes_mentioning(str(data_dir)), "children should be running"
        # make run serves the tus endpoint too (the upload service's, with CORS for any origin).
        discovery = _tus_discovery(tus_port)
        assert discovery.status_code == 204 and discovery.headers["Tus-Version"] == "1.0.0"
        assert discovery.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest[-3000:]
    assert "all stopped" in rest
    assert _processes_mentioning(str(data_dir)) == []


def test_run_refuses_to_start_when_a_port_is_taken(tmp_path: Path) -> None:
    import socket

    data_dir = tmp_path / "serentak-busy-data"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy_port = taken.getsockname()[1]
        env = {
            **os.environ,
            "SERENTAK_DATA_DIR": str(data_dir),
            "SERENTAK_ETCD_ENDPOINT": f"127.0.0.1:{free_port()}",
            "SERENTAK_UPLOAD_PORT": str(busy_port),
            "SERENTAK_LOCKS_PORT": str(free_port()),
            "SERENTAK_NOTIFY_PORT": str(free_port()),
            "PYTHONPATH": str(REPO_ROOT),
        }
        for name in ("UPLOAD", "LOCKS", "NOTIFY"):
            env[f"SERENTAK_{name}_METRICS_PORT"] = str(free_port())
        done = subprocess.run(
            [sys.executable, "-m", "deploy.local.run"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert str(busy_port) in done.stdout + done.stderr
    assert _processes_mentioning(str(data_dir)) == []
