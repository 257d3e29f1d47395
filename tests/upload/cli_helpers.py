"""Running the `serentak` CLI as a subprocess against a test cluster."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """A finished CLI process."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        """stdout as the one JSON document `--json` promises."""
        return json.loads(self.out)


def cli_env(**extra: str) -> dict[str, str]:
    """The test's environment without the CLI's own variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERENTAK_")}
    env.update(extra)
    return env


async def start(*argv: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """Start `serentak ARGV` (the server runs in this test's event loop, so never block)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "serentak.cli",
        *argv,
        cwd=REPO,
        env=env or cli_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def serentak(*argv: str, env: dict[str, str] | None = None) -> Run:
    """Run `serentak ARGV` to the end."""
    proc = await start(*argv, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def one_line_error(run: Run) -> str:
    """The error message: one `serentak: ...` line (after any progress), no traceback."""
    assert "Traceback" not in run.err, run.err
    errors = [line for line in run.err.splitlines() if line.startswith("serentak: ")]
    assert len(errors) == 1, run.err
    return errors[0]
