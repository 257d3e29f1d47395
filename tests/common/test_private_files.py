"""Folders the service makes for its data are 0700 whatever the umask, made whole or in
part, and an existing one left open is closed again; a file in the way is left alone."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.private_files import private_dirs


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that would leave new folders readable by everyone (0755)."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_folder_in_an_existing_one_is_private(tmp_path: Path, open_umask: None) -> None:
    made = private_dirs(tmp_path / "files")
    assert made == tmp_path / "files"
    assert mode(made) == 0o700


def test_missing_parents_are_made_private_too(tmp_path: Path, open_umask: None) -> None:
    private_dirs(tmp_path / "a" / "b" / "c")
    for folder in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert mode(folder) == 0o700


def test_an_existing_open_folder_is_closed(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o755)
    private_dirs(folder)
    assert mode(folder) == 0o700


def test_a_file_in_the_way_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"x")
    path.chmod(0o644)
    assert private_dirs(path) == path
    assert mode(path) == 0o644
