"""What a child process fsyncs, as strace sees it: for code that fsyncs outside Python
(merge_core), where patching os.fsync sees nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

STRACE = shutil.which("strace")


def fsynced_paths(tmp_path: Path, script: str) -> list[str]:
    """The paths a child running `script` opened and then fsynced (strace's view)."""
    log = tmp_path / "strace.log"
    trace = ["-f", "-qq", "-o", str(log), "-e", "trace=openat,fsync,fdatasync"]
    subprocess.run(
        [STRACE or "strace", *trace, sys.executable, "-c", script],
        check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    opened: dict[str, str] = {}
    synced: list[str] = []
    for line in log.read_text().splitlines():
        if m := re.search(r'openat\(AT_FDCWD, "([^"]+)", [^)]*\) = (\d+)', line):
            opened[m.group(2)] = m.group(1)
        elif m := re.search(r"f(?:data)?sync\((\d+)\) += 0", line):
            synced.append(opened[m.group(1)])
    return synced
