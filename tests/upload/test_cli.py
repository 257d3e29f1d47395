"""The `serentak` CLI against a running upload service: upload, resume, status, ls, download."""

from __future__ import annotations

import asyncio
import os

import pytest

from services.cli import main


@pytest.fixture
def database_url(tmp_path) -> str:
    """SQLite only: the CLI is a client, the database under it does not matter here."""
    return f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"


async def test_cli_upload_ls_download(cluster, tmp_path, capsys) -> None:
    source = tmp_path / "movie.bin"
    data = os.urandom(5 * 1024 + 17)
    source.write_bytes(data)
    base = ["--address", cluster.address, "--token", "dev-alice"]
    up = ["upload", str(source), "--parallel", "3", "--chunk-size", "1KiB"]
    assert await asyncio.to_thread(main, [*base, *up]) == 0
    words = capsys.readouterr().out.strip().splitlines()[-1].split()
    upload_id, file_id = words[0], words[3]
    # Re-running resumes the same upload (nothing missing, same file).
    assert await asyncio.to_thread(main, [*base, *up]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].split()[3] == file_id
    assert await asyncio.to_thread(main, [*base, "status", upload_id]) == 0
    assert "UPLOAD_STATUS_COMPLETED" in capsys.readouterr().out
    assert await asyncio.to_thread(main, [*base, "ls"]) == 0
    assert "movie.bin" in capsys.readouterr().out
    target = tmp_path / "back.bin"
    assert await asyncio.to_thread(main, [*base, "download", file_id, str(target)]) == 0
    assert target.read_bytes() == data
