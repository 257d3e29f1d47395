"""Build step: the wheel carries the generated protobuf/gRPC stubs as the `serentak` package.

`pip wheel .` runs grpc_tools.protoc on protos/ into the build directory, so the wheel holds
`serentak/{upload,locks,notify,events,admin}/v1/*_pb2{,_grpc}.py` (+ .pyi) and
`serentak/descriptors.binpb` (the descriptor set with comments that reflection serves) beside
`services/`: the import paths are the same as in a checkout, with no `.pth`. An editable install
(`make setup`) skips this; there `gen/` (from `make protos`) is on the path instead.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithStubs(build_py):
    """build_py, then protoc into build_lib (never into the source tree)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        from grpc_tools import protoc  # the build requirement (pyproject [build-system])

        out = Path(self.build_lib)
        (out / "serentak").mkdir(parents=True, exist_ok=True)
        src = ROOT / "protos"
        protos = sorted(str(p.relative_to(src)) for p in src.rglob("*.proto"))
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"-I{Path(protoc.__file__).parent / '_proto'}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            "--include_source_info",
            "--include_imports",
            f"--descriptor_set_out={out / 'serentak' / 'descriptors.binpb'}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed on protos/")
        # The stubs ship their .pyi files: mark the package typed (PEP 561).
        (out / "serentak" / "py.typed").touch()


setup(cmdclass={"build_py": BuildPyWithStubs})
