"""buf lint (STANDARD, the exceptions in buf.yaml) and buf breaking against the previous commit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = Path(sys.executable).with_name("buf")


def _buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUF), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _copy_module(tmp_path: Path) -> Path:
    """A scratch copy of buf.yaml + protos/ to break on purpose."""
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "protos", work / "protos")
    shutil.copy(ROOT / "buf.yaml", work / "buf.yaml")
    return work


def test_buf_lint_passes() -> None:
    result = _buf("lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_lint_exceptions_are_narrow(tmp_path: Path) -> None:
    # A new RPC returning a shared message in a file without exceptions is refused.
    work = _copy_module(tmp_path)
    admin = work / "protos/serentak/admin/v1/admin.proto"
    text = admin.read_text()
    text = text.replace(
        "service AdminService {",
        "service AdminService {\n  rpc Peek(QueueStatsRequest) returns (QueueStatsResponse);",
        1,
    )
    admin.write_text(text)
    result = _buf("lint", cwd=work)
    assert result.returncode != 0
    assert 'RPC request type "QueueStatsRequest" should be named "PeekRequest"' in result.stdout


def test_buf_breaking_against_previous_commit() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no previous commit to compare with")
    prev = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", "HEAD~1"], cwd=ROOT, capture_output=True, check=False
    )
    if prev.returncode != 0:
        pytest.skip("shallow clone: HEAD~1 is not available")
    # The working tree (committed or not) against the commit before HEAD.
    result = _buf("breaking", "--against", ".git#ref=HEAD~1,subdir=protos")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_catches_a_renumbered_field(tmp_path: Path) -> None:
    work = _copy_module(tmp_path)
    locks = work / "protos/serentak/locks/v1/locks.proto"
    text = locks.read_text()
    assert "string key = 1;" in text
    locks.write_text(text.replace("string key = 1;", "string key = 99;", 1))
    result = _buf("breaking", "--against", str(ROOT / "protos"), cwd=work)
    assert result.returncode != 0
    assert "changed from" in result.stdout or "deleted" in result.stdout, result.stdout
