"""The one generator of the `serentak` contracts: protoc on the protos, into a folder.

    python client/protogen.py            # into client/ (the editable layout; `make protos`)

`setup.py` calls `generate(build_lib)` when it builds a wheel, and `generate(client/)` for
an editable install, so the stubs are made by this function and nothing else. It writes
`serentak/{events,upload,locks,notify,admin}/v1/*_pb2.py`, `*_pb2_grpc.py`, their `.pyi`
(the grpc ones by mypy-protobuf) and `serentak/descriptors.binpb`: the descriptor set with
the protos' comments (`--include_source_info`) and imports, which server reflection serves.
The generated folders are gitignored: they are never committed nor edited by hand.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The generated packages (one per proto package under protos/serentak/).
GENERATED = ("admin", "events", "locks", "notify", "upload")
DESCRIPTOR_SET = "descriptors.binpb"


def protos_dir() -> Path:
    """The protos: beside this file in an sdist (`protos/`), else the repository's."""
    for candidate in (HERE / "protos", HERE.parent / "protos"):
        if (candidate / "serentak").is_dir():
            return candidate
    raise SystemExit(f"no protos/ beside {HERE} or in {HERE.parent}")


def _mypy_grpc_plugin() -> str:
    """mypy-protobuf's protoc plugin (a build requirement), typed `_pb2_grpc.pyi` files."""
    name = "protoc-gen-mypy_grpc"
    found = shutil.which(name) or shutil.which(name, path=sysconfig.get_path("scripts"))
    found = found or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit(f"{name} not found: install mypy-protobuf")
    return found


def generate(out: Path) -> None:
    """Generate the stubs and the descriptor set into `out` (`out/serentak/...`).

    What an earlier run left in the generated folders is removed first, so a deleted proto
    leaves no stale module behind.
    """
    from grpc_tools import protoc  # a build requirement (pyproject [build-system])

    src = protos_dir()
    package = out / "serentak"
    for name in GENERATED:
        shutil.rmtree(package / name, ignore_errors=True)
    package.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(src)) for p in src.rglob("*.proto"))
    args = [
        "grpc_tools.protoc",
        f"-I{src}",
        f"-I{Path(protoc.__file__).parent / '_proto'}",
        f"--plugin=protoc-gen-mypy_grpc={_mypy_grpc_plugin()}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_grpc_out={out}",
        "--include_source_info",
        "--include_imports",
        f"--descriptor_set_out={package / DESCRIPTOR_SET}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {src}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
