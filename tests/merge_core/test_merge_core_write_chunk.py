"""merge_core.write_chunk: a received chunk written to a new 0600 file and hashed in one
pass; the exact bytes, the fsync (seen by strace), nothing left on a mismatch or an error,
and precise errors for bad arguments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.strace import STRACE, fsynced_paths

import merge_core
from merge_core import Hasher, MergeIOError, write_chunk


def digest(data: bytes, algorithm: str = "sha256") -> str:
    hasher = Hasher(algorithm)
    hasher.update(data)
    return hasher.finalize()


@pytest.mark.parametrize("algorithm", merge_core.ALGORITHMS)
@pytest.mark.parametrize("size", [0, 1, 256 * 1024, 4 * 1024 * 1024 + 7])
def test_writes_exactly_the_bytes_0600_and_returns_their_digest(
    tmp_path: Path, algorithm: str, size: int
) -> None:
    data = os.urandom(size)
    path = tmp_path / "chunk"
    assert write_chunk(path, data, algorithm, digest(data, algorithm)) == digest(data, algorithm)
    assert path.read_bytes() == data
    assert path.stat().st_mode & 0o777 == 0o600
    # Without an expected digest the bytes are kept too (and fsync may be off).
    other = tmp_path / "unchecked"
    assert write_chunk(other, data, algorithm, None, False) == digest(data, algorithm)
    assert other.read_bytes() == data


def test_takes_any_buffer_not_only_bytes(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    strided = memoryview(data)[::2]  # not C-contiguous: copied, then written
    assert write_chunk(tmp_path / "a", strided) == digest(data[::2])
    assert (tmp_path / "a").read_bytes() == data[::2]
    assert write_chunk(tmp_path / "b", bytearray(data)) == digest(data)
    assert (tmp_path / "b").read_bytes() == data


def test_a_mismatch_keeps_nothing_and_answers_the_actual_digest(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    path = tmp_path / "chunk"
    assert write_chunk(path, data, "sha256", "0" * 64) == digest(data)
    assert os.listdir(tmp_path) == []


def test_never_overwrites_and_an_io_error_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "chunk"
    path.write_bytes(b"old")
    with pytest.raises(MergeIOError) as caught:
        write_chunk(path, b"new")
    assert (caught.value.errno, caught.value.operation) == (17, "open")  # EEXIST
    assert path.read_bytes() == b"old"
    with pytest.raises(MergeIOError) as caught:
        write_chunk(tmp_path / "no-such-folder" / "chunk", b"x")
    assert caught.value.errno == 2  # ENOENT
    assert os.listdir(tmp_path) == ["chunk"]


def test_an_unknown_algorithm_is_a_precise_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r'unknown checksum algorithm "md5"'):
        write_chunk(tmp_path / "chunk", b"abc", "md5")
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(STRACE is None, reason="strace is installed by .ci/run")
def test_the_kept_file_is_fsynced_and_a_refused_one_is_not(tmp_path: Path) -> None:
    kept, refused, unsynced = tmp_path / "kept", tmp_path / "refused", tmp_path / "unsynced"
    data = bytes(range(256)) * 256
    script = (
        "import merge_core, hashlib\n"
        "data = bytes(range(256)) * 256\n"
        "good = hashlib.sha256(data).hexdigest()\n"
        f"merge_core.write_chunk({str(kept)!r}, data, 'sha256', good)\n"
        f"merge_core.write_chunk({str(refused)!r}, data, 'sha256', '0' * 64)\n"
        f"merge_core.write_chunk({str(unsynced)!r}, data, 'sha256', good, False)\n"
    )
    assert fsynced_paths(tmp_path, script) == [str(kept)]
    assert kept.read_bytes() == data and unsynced.read_bytes() == data
    assert not refused.exists()
