"""A reader that closes stdout early (`serentak ls | head`) ends the CLI quietly with 141
(128 + SIGPIPE, what a shell shows for a C tool SIGPIPE ended), not `[Errno 32] Broken
pipe` and exit 2."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from upload.cli_helpers import REPO, cli_env


async def _into_a_closed_pipe(*argv: str) -> tuple[int, str]:
    """Run `serentak ARGV` with stdout a pipe whose reader is already gone: every write
    fails, as after `head` has read its lines and exited, but without racing it."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "serentak.cli",
            *argv,
            cwd=REPO,
            env=cli_env(),
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
        )
    finally:
        os.close(write_end)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["lines", "json"])
async def test_ls_into_a_closed_pipe_exits_141_quietly(stack, tmp_path: Path, json_flag) -> None:
    source = tmp_path / "one.txt"
    source.write_bytes(b"one")
    async with stack.client("dev-alice") as alice:
        await alice.upload(source)
    code, err = await _into_a_closed_pipe("--address", stack.upload, "ls", *json_flag)
    assert (code, err) == (141, "")


async def test_ls_piped_into_head_prints_the_first_line_and_no_error(stack, tmp_path: Path) -> None:
    async with stack.client("dev-alice") as alice:
        folders = [await alice.create_folder(f"f{i:03d}") for i in range(3)]
    shell = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        f'"{sys.executable}" -m serentak.cli --address {stack.upload} ls | head -n 1',
        cwd=REPO,
        env=cli_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(shell.communicate(), timeout=120)
    assert shell.returncode == 0 and err == b""
    assert out.decode().split()[1] == folders[0].file_id
