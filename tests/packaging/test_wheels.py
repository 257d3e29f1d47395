"""The three wheels (the client `serentak`, `serentak-server`, merge_core), built from this
checkout and installed without it.

- All three into a fresh virtualenv of the services' Python: the services, the generated
  stubs as `serentak.*`, merge_core and the `serentak` command line import and run from the
  wheels (the pinned dependencies come from the dev virtualenv).
- The client wheel alone, its dependencies from the package index, into fresh virtualenvs of
  the oldest and newest Pythons it supports (pyenv's 3.10 and 3.13): nothing of the server
  is importable there, its installed size is printed, and against the services running from
  this checkout its CLI uploads and downloads a file and its SDK holds a lock until the lock
  is lost (the block cancelled, LockLost raised). With CI=true a missing pyenv Python fails;
  elsewhere those tests are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.services import REPO_ROOT, service_process

from services.locks.etcd_client import Etcd

pytestmark = pytest.mark.slow

IN_CI = os.environ.get("CI", "").lower() == "true"
MATURIN = Path(sys.executable).with_name("maturin")
CHUNK = 64 * 1024
PYENV = Path.home() / ".pyenv" / "versions"
# The oldest and the newest Python the client supports (client/pyproject.toml).
CLIENT_PYTHONS = {"3.10": PYENV / "3.10.13/bin/python", "3.13": PYENV / "3.13.0/bin/python"}

# Run by a client virtualenv's python: hold a lock with the SDK, print its lease id, and
# report what ends the hold (the test revokes the lease meanwhile).
HOLD_UNTIL_LOST = """
import asyncio, sys
from serentak.sdk import LockLost, SerentakClient

async def main() -> None:
    async with SerentakClient(sys.argv[1], token="dev-alice", locks_address=sys.argv[2]) as c:
        cancelled = False
        try:
            async with c.hold(f"user:alice:wheel-{sys.version_info[1]}", ttl_seconds=5) as lock:
                print(lock.lock.lease_id, flush=True)
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled = True
                    raise
        except LockLost as lost:
            print("lost", cancelled, lost.metadata.get("lost_reason"), flush=True)

asyncio.run(main())
"""


def _run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _clean_env() -> dict[str, str]:
    """The environment without this checkout on the path."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _pip_wheel(source: Path, out: Path) -> None:
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            out,
            source,
        ],
        cwd=out,
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three wheels, built from this checkout."""
    wheels = tmp_path_factory.mktemp("dist")
    _pip_wheel(REPO_ROOT / "client", wheels)
    _pip_wheel(REPO_ROOT, wheels)
    _run([MATURIN, "build", "--release", "-q", "-o", wheels], cwd=REPO_ROOT / "merge_core")
    names = sorted(w.name.split("-")[0] for w in wheels.glob("*.whl"))
    assert names == ["merge_core", "serentak", "serentak_server"], names
    return wheels


@pytest.fixture(scope="module")
def fresh_venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv holding the three wheels; the pinned dependencies come from the dev
    virtualenv's site-packages (appended to the path, so the wheels win; its .pth files, the
    editable installs among them, are not processed)."""
    base = tmp_path_factory.mktemp("wheels")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=base)
    py = venv / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            py,
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            *sorted(dist.glob("*.whl")),
        ],
        cwd=base,
    )
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], base)
    Path(site.strip(), "dev_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


@pytest.fixture(scope="module")
def stack(etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    """locks, notify and upload as processes of this checkout: their addresses."""
    folder = tmp_path_factory.mktemp("stack")
    env = {"SERENTAK_ETCD_ENDPOINT": etcd.endpoint, "SERENTAK_MIN_CHUNK_SIZE": str(CHUNK)}
    with contextlib.ExitStack() as running:
        locks = running.enter_context(service_process("locks", folder, env))
        env["SERENTAK_LOCKS_ADDRESS"] = locks.address
        notify = running.enter_context(service_process("notify", folder, env))
        env["SERENTAK_NOTIFY_ADDRESS"] = notify.address
        upload = running.enter_context(service_process("upload", folder, env))
        yield {"upload": upload.address, "locks": locks.address, "notify": notify.address}


def _round_trip(venv: Path, upload_address: str, folder: Path, name: str) -> None:
    """Upload a file with the installed `serentak`, find it with `ls`, download it back."""
    data = os.urandom(3 * CHUNK + 123)
    (folder / name).write_bytes(data)
    cli = [venv / "bin" / "serentak", "--address", upload_address, "--token", "dev-alice"]
    env = _clean_env()
    _run([*cli, "upload", name, "--chunk-size", str(CHUNK), "--no-progress"], folder, env)
    listing = json.loads(_run([*cli, "ls", "--json"], folder, env))
    (file_id,) = [f["file_id"] for f in listing["files"] if f["name"] == name]
    _run([*cli, "download", file_id, "out.bin", "--no-progress"], folder, env)
    assert (folder / "out.bin").read_bytes() == data


def test_installed_wheels_import_and_run(fresh_venv: Path, tmp_path: Path) -> None:
    py = fresh_venv / "bin" / "python"
    where = _run(
        [
            py,
            "-c",
            "import serentak.upload.v1.upload_pb2_grpc as s, services, merge_core,"
            " importlib.resources as r; print(s.__file__); print(services.__file__);"
            " print(merge_core.__file__);"
            " print(len(r.files('serentak').joinpath('descriptors.binpb').read_bytes()))",
        ],
        cwd=tmp_path,
        env=_clean_env(),
    ).split()
    for path in where[:3]:
        assert path.startswith(str(fresh_venv)), where
    assert int(where[3]) > 0
    # Typed packages (PEP 561) for code that imports the SDK and the contracts.
    contracts_root = Path(where[0]).parents[2]  # serentak/upload/v1/upload_pb2_grpc.py
    services_root = Path(where[1]).parent
    for root in (contracts_root, services_root):
        assert (root / "py.typed").is_file(), root
    assert (contracts_root / "upload" / "v1" / "upload_pb2_grpc.pyi").is_file()
    assert "upload" in _run([fresh_venv / "bin" / "serentak", "--help"], tmp_path, _clean_env())


def test_installed_cli_uploads_and_downloads(
    fresh_venv: Path, stack: dict[str, str], tmp_path: Path
) -> None:
    _round_trip(fresh_venv, stack["upload"], tmp_path, "big.bin")


def _site_size(venv: Path) -> int:
    """Bytes of the files in `venv`'s site-packages."""
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    return sum(
        (Path(root) / name).lstat().st_size
        for root, _dirs, files in os.walk(site)
        for name in files
    )


@pytest.fixture(scope="module", params=sorted(CLIENT_PYTHONS))
def client_venv(
    request: pytest.FixtureRequest, dist: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, int]:
    """A virtualenv of that Python with the client wheel alone (its dependencies from the
    package index): its version, its folder, and the bytes the client added to it."""
    version = request.param
    python = CLIENT_PYTHONS[version]
    if not python.exists():
        message = f"pyenv's Python {version} ({python}) is not installed"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    base = tmp_path_factory.mktemp(f"client-{version}")
    bare, venv = base / "bare", base / "venv"
    _run([python, "-m", "venv", bare], cwd=base)
    _run([python, "-m", "venv", venv], cwd=base)
    _run(
        [
            venv / "bin" / "python",
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--find-links",
            dist,
            "serentak",
        ],
        cwd=base,
        env=_clean_env(),
    )
    return version, venv, _site_size(venv) - _site_size(bare)


def test_the_client_alone_installs_small_on_its_oldest_and_newest_python(
    client_venv: tuple[str, Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version, venv, added = client_venv
    py = venv / "bin" / "python"
    found = _run(
        [
            py,
            "-c",
            "import importlib.util as u, sys, serentak.cli, serentak.sdk, serentak.upload.v1;"
            " print(sys.version_info[:2]);"
            " print([m for m in ('services', 'sqlalchemy', 'pydantic', 'structlog', 'rich')"
            " if u.find_spec(m)])",
        ],
        cwd=tmp_path,
        env=_clean_env(),
    ).splitlines()
    assert found[0] == str(tuple(int(p) for p in version.split("."))), found
    assert found[1] == "[]", f"server packages in the client's virtualenv: {found[1]}"
    listed = _run([py, "-m", "pip", "list", "--format=freeze"], tmp_path, _clean_env())
    packages = sorted(
        line for line in listed.splitlines() if line.split("==")[0] not in ("pip", "setuptools")
    )
    with capsys.disabled():
        print(
            f"\nclient wheel on Python {version}: {added / 2**20:.1f} MiB installed "
            f"(site-packages minus a bare virtualenv's), {len(packages)} packages: "
            + ", ".join(packages)
        )


def test_the_client_alone_round_trips_and_holds_a_lock_until_it_is_lost(
    client_venv: tuple[str, Path, int],
    stack: dict[str, str],
    etcd,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    version, venv, _added = client_venv
    _round_trip(venv, stack["upload"], tmp_path, f"client-{version}.bin")
    holder = subprocess.Popen(
        [venv / "bin" / "python", "-c", HOLD_UNTIL_LOST, stack["upload"], stack["locks"]],
        cwd=tmp_path,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        first = holder.stdout.readline()
        assert first.strip().isdigit(), (first, holder.stderr and holder.stderr.read())
        lease_id = int(first)

        async def revoke() -> None:
            direct = Etcd(etcd.endpoint, call_timeout=5)
            try:
                await direct.revoke_lease(lease_id)
            finally:
                await direct.close()

        asyncio.run(revoke())
        out, err = holder.communicate(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 0, err
    assert out.split() == ["lost", "True", "LOST_REASON_LEASE_EXPIRED"], (out, err)
