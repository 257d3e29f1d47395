"""requirements/*.lock: the whole dependency tree pinned with hashes (`make lock`, uv), and
current with pyproject.toml: every top-level pin (the server's, the client's it pulls in,
the dev extra's) is in its lock at the same version, and every locked package carries a
hash, so `pip install --require-hashes` (the image) installs exactly what was tested."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCKS = REPO_ROOT / "requirements"
# The runtime's Python: markers (the client's `python_version<'3.11'` pins) are read for it.
ENVIRONMENT = {"python_version": "3.11", "python_full_version": "3.11.0"}


def _entries(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """Locked package -> (version, hashes), from a pip requirements file."""
    logical, current = [], ""
    for line in lock.read_text().splitlines():
        line = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            logical.append(current.strip())
        current = ""
    entries: dict[str, tuple[str, list[str]]] = {}
    for text in logical:
        spec = text.split(" --hash=", 1)[0].split(";", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?==(\S+)", spec)
        assert match, f"{lock.name}: not an exact pin: {text[:80]}"
        hashes = re.findall(r"--hash=(sha256:[0-9a-f]{64})", text)
        entries[canonicalize_name(match.group(1))] = (match.group(3), hashes)
    return entries


def _pins(requirements: list[str]) -> dict[str, str]:
    """Top-level `name==version` pins whose markers hold on the runtime's Python."""
    pins = {}
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(ENVIRONMENT):
            continue
        (spec,) = req.specifier
        assert spec.operator == "==", f"not pinned: {text}"
        pins[canonicalize_name(req.name)] = spec.version
    return pins


def _project() -> tuple[dict[str, str], dict[str, str]]:
    server = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((REPO_ROOT / "client" / "pyproject.toml").read_text())["project"]
    runtime = _pins(server["dependencies"]) | _pins(client["dependencies"])
    runtime.pop("serentak")  # this repository's client, built by the image, never locked
    return runtime, _pins(server["optional-dependencies"]["dev"])


@pytest.mark.parametrize("name", ["server", "dev"])
def test_every_top_level_pin_is_locked_at_its_version(name: str) -> None:
    runtime, dev = _project()
    wanted = runtime | (dev if name == "dev" else {})
    locked = _entries(LOCKS / f"{name}.lock")
    assert len(locked) > len(wanted)  # the transitive ones too
    stale = {
        pkg: (version, locked.get(pkg, ("missing",))[0])
        for pkg, version in wanted.items()
        if locked.get(pkg, ("",))[0] != version
    }
    assert not stale, f"run `make lock`: pyproject vs {name}.lock: {stale}"
    assert "serentak" not in locked


@pytest.mark.parametrize("name", ["server", "dev"])
def test_every_locked_package_has_a_hash(name: str) -> None:
    locked = _entries(LOCKS / f"{name}.lock")
    assert all(hashes for _, hashes in locked.values()), [
        p for p, (_, h) in locked.items() if not h
    ]


def test_the_server_lock_is_a_subset_of_the_dev_lock_at_the_same_versions() -> None:
    server, dev = _entries(LOCKS / "server.lock"), _entries(LOCKS / "dev.lock")
    differ = {
        p: (v, dev.get(p, ("missing",))[0])
        for p, (v, _) in server.items()
        if dev.get(p, ("",))[0] != v
    }
    assert not differ  # the tests (dev venv) ran what the image installs


def test_make_lock_regenerates_both_with_hashes() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "\nlock:" in makefile and "--generate-hashes" in makefile
    for name in ("server", "dev"):
        assert f"-o requirements/{name}.lock" in makefile
        assert "make lock" in (LOCKS / f"{name}.lock").read_text().splitlines()[1]
