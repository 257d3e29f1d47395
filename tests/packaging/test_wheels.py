"""The project wheel and merge_core's wheel, installed into a fresh virtualenv, import and run
without the checkout: `serentak --help`, the generated stubs as `serentak.*`, and an upload
and a download by the installed CLI against a running stack."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support.services import REPO_ROOT, service_process

pytestmark = pytest.mark.slow

MATURIN = Path(sys.executable).with_name("maturin")
CHUNK = 64 * 1024

# Run by the fresh venv's python: the root folder's entry named sys.argv[2], by its file id.
FIND_FILE = """
import sys, grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    reply = upload_pb2_grpc.FileServiceStub(channel).ListFolder(
        upload_pb2.ListFolderRequest(), metadata=[("authorization", "Bearer dev-alice")],
        timeout=10)
print(next(f.file_id for f in reply.files if f.name == sys.argv[2]))
"""


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv holding the two wheels; the pinned dependencies come from the dev
    virtualenv's site-packages (appended to the path, so the wheels win; its .pth files, the
    editable install and gen/ among them, are not processed)."""
    base = tmp_path_factory.mktemp("wheels")
    wheels = base / "dist"
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
            str(wheels),
            str(REPO_ROOT),
        ],
        cwd=base,
    )
    _run(
        [str(MATURIN), "build", "--release", "-q", "-o", str(wheels)], cwd=REPO_ROOT / "merge_core"
    )
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base)
    py = venv / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        cwd=base,
    )
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], base)
    Path(site.strip(), "dev_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def test_installed_wheels_import_and_run(fresh_venv: Path, tmp_path: Path) -> None:
    py = fresh_venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = _run(
        [
            str(py),
            "-c",
            "import serentak.upload.v1.upload_pb2_grpc as s, services, merge_core,"
            " importlib.resources as r; print(s.__file__); print(services.__file__);"
            " print(merge_core.__file__);"
            " print(len(r.files('serentak').joinpath('descriptors.binpb').read_bytes()))",
        ],
        cwd=tmp_path,
        env=env,
    ).split()
    for path in where[:3]:
        assert path.startswith(str(fresh_venv)), where
    assert int(where[3]) > 0
    # Typed packages (PEP 561) for code that imports the SDK and the contracts.
    contracts_root = Path(where[0]).parents[2]  # serentak/upload/v1/upload_pb2_grpc.py
    services_root = Path(where[1]).parent
    for root in (contracts_root, services_root):
        assert (root / "py.typed").is_file(), root
    assert "upload" in _run([str(fresh_venv / "bin" / "serentak"), "--help"], tmp_path, env)


def test_installed_cli_uploads_and_downloads(fresh_venv: Path, tmp_path: Path, etcd) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    data = os.urandom(3 * CHUNK + 123)
    (tmp_path / "big.bin").write_bytes(data)
    svc_env = {"SERENTAK_ETCD_ENDPOINT": etcd.endpoint, "SERENTAK_MIN_CHUNK_SIZE": str(CHUNK)}
    with service_process("locks", tmp_path, svc_env) as locks:
        svc_env["SERENTAK_LOCKS_ADDRESS"] = locks.address
        with service_process("notify", tmp_path, svc_env) as notify:
            svc_env["SERENTAK_NOTIFY_ADDRESS"] = notify.address
            with service_process("upload", tmp_path, svc_env) as upload:
                cli = [
                    str(fresh_venv / "bin" / "serentak"),
                    "--address",
                    upload.address,
                    "--token",
                    "dev-alice",
                ]
                _run([*cli, "upload", "big.bin", "--chunk-size", str(CHUNK)], tmp_path, env)
                file_id = _run(
                    [
                        str(fresh_venv / "bin" / "python"),
                        "-c",
                        FIND_FILE,
                        upload.address,
                        "big.bin",
                    ],
                    tmp_path,
                    env,
                ).strip()
                _run([*cli, "download", file_id, "out.bin"], tmp_path, env)
    assert (tmp_path / "out.bin").read_bytes() == data
