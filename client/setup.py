"""Build step of the client: the wheel carries the `serentak` contracts, generated here.

`pip wheel client/` runs `protogen.generate` into the build directory (never the source
tree), so the wheel holds the stubs and `serentak/descriptors.binpb`. An editable install
(`pip install -e client/`, `make setup`) generates into the source tree instead, where the
generated folders are gitignored. An sdist carries a copy of the protos (`protos/`), so a
wheel built from it needs nothing outside it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from protogen import generate, protos_dir  # noqa: E402  (beside this file, not installed)


class BuildPyWithStubs(build_py):
    """build_py, then protoc: into build_lib, or into the source tree when editable."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            generate(HERE)
        else:
            generate(Path(self.build_lib))


class SdistWithProtos(sdist):
    """The sdist carries the protos its wheel is generated from."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        shutil.copytree(protos_dir(), Path(base_dir) / "protos", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos})
