"""Fixtures of the deploy/ tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PKI_SCRIPT = REPO_ROOT / "deploy" / "pki" / "gen-pki.sh"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PKI made by deploy/pki/gen-pki.sh (as compose's init service makes it)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    out = tmp_path_factory.mktemp("pki")
    shell = shutil.which("dash") or "sh"  # POSIX sh, as in the alpine init container
    subprocess.run([shell, str(PKI_SCRIPT), str(out)], check=True, capture_output=True)
    return out
