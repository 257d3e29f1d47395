"""A real etcd server on 127.0.0.1, in a folder of its own, for one test or session."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from deploy.local.etcd import etcd_command, etcd_healthy
from deploy.local.etcd import find_etcd_binary as etcd_binary
from support.ports import free_port

START_TIMEOUT_S = 30.0


class EtcdServer:
    """One etcd member. `stop()` then `start()` keeps its data and port (a restart)."""

    def __init__(self, data_dir: Path, binary: str | None = None) -> None:
        found = binary or etcd_binary()
        if found is None:
            raise RuntimeError("no etcd binary: set ETCD_BIN or install etcd-server")
        self.binary = found
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def endpoint(self) -> str:
        """host:port of the client URL."""
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        """Start (or restart) and return once /health answers true."""
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            etcd_command(self.binary, "serentak-test", self.data_dir, client, peer),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")
            if etcd_healthy(client):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not become healthy: {self.log_path}")
            time.sleep(0.05)  # polling an observable condition (health), bounded by deadline

    def stop(self) -> None:
        """Stop gracefully (SIGTERM), killing it if it does not exit."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
