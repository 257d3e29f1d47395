"""merge_core.put_file: a whole object written into place in one call (the local blob
store's put): the exact bytes 0600 in 0700 folders, made as needed; the staged file, the
object's folder and the folders named fsynced in that order (seen by strace); and on an
error before the rename, nothing changed and no staged file left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.strace import STRACE, fsynced_paths

from merge_core import MergeIOError, put_file


def test_puts_the_exact_bytes_0600_in_folders_made_0700(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    path = tmp_path / "files" / "f1" / "u1"
    put_file(path, path.parent / ".u1.x.tmp", memoryview(data)[::3], folders=[tmp_path])
    assert path.read_bytes() == data[::3]  # any buffer: a strided view is copied first
    assert path.stat().st_mode & 0o777 == 0o600
    assert {(tmp_path / f).stat().st_mode & 0o777 for f in ("files", "files/f1")} == {0o700}
    assert os.listdir(path.parent) == ["u1"]


def test_replaces_the_object_in_place(tmp_path: Path) -> None:
    path = tmp_path / "o"
    path.write_bytes(b"old")
    put_file(path, tmp_path / ".o.tmp", b"new", False)
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["o"]


def test_an_error_before_the_rename_changes_nothing(tmp_path: Path) -> None:
    path, staged = tmp_path / "o", tmp_path / ".o.tmp"
    path.write_bytes(b"old")
    staged.write_bytes(b"another writer's")
    with pytest.raises(MergeIOError) as caught:
        put_file(path, staged, b"new")
    assert (caught.value.errno, caught.value.operation) == (17, "open")  # EEXIST
    assert path.read_bytes() == b"old" and staged.read_bytes() == b"another writer's"
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(MergeIOError) as caught:
        put_file(tmp_path / "a-file" / "o", tmp_path / "a-file" / ".o.tmp", b"x")
    assert caught.value.errno == 20  # ENOTDIR: its folder cannot be made
    assert sorted(os.listdir(tmp_path)) == [".o.tmp", "a-file", "o"]


@pytest.mark.skipif(STRACE is None, reason="strace is installed by .ci/run")
def test_the_file_then_its_folder_then_the_folders_named_are_fsynced(tmp_path: Path) -> None:
    path, staged = tmp_path / "files" / "f1" / "u1", tmp_path / "files" / "f1" / ".u1.tmp"
    unsynced = tmp_path / "unsynced"
    script = (
        "import merge_core\n"
        f"merge_core.put_file({str(path)!r}, {str(staged)!r}, b'abc',"
        f" folders=[{str(tmp_path / 'files')!r}, {str(tmp_path)!r}])\n"
        f"merge_core.put_file({str(unsynced)!r}, {str(unsynced) + '.tmp'!r}, b'abc', False)\n"
    )
    assert fsynced_paths(tmp_path, script) == [
        str(staged),
        str(path.parent),
        str(tmp_path / "files"),
        str(tmp_path),
    ]
    assert path.read_bytes() == b"abc" and unsynced.read_bytes() == b"abc"
