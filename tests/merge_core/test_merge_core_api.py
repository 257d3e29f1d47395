"""merge_core's Python API: results, errors and their attributes, cleanup."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import merge_core
from merge_core import (
    Chunk,
    ChunkChecksumMismatch,
    ChunkSizeMismatch,
    DuplicateChunk,
    FileChecksumMismatch,
    Hasher,
    MergeError,
    MergeIOError,
    MissingChunk,
    checksum_file,
    merge,
)

MakeChunks = Callable[..., tuple[list[Chunk], bytes]]


def digest(data: bytes, algorithm: str = "sha256") -> str:
    hasher = Hasher(algorithm)
    hasher.update(data)
    return hasher.finalize()


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_merge_result_and_content(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, data = make_chunks([1000, 0, 70_000, 1])
    out = tmp_path / "out.bin"
    result = merge(reversed(chunks), out)
    assert out.read_bytes() == data
    assert result.output_path == str(out)
    assert result.size == len(data)
    assert result.checksum == hashlib.sha256(data).hexdigest()
    assert result.algorithm == "sha256"
    assert result.chunk_count == 4
    assert result.to_dict()["checksum"] == result.checksum


@pytest.mark.parametrize("use_mmap", [True, False])
def test_mmap_and_read_modes_agree_across_windows(
    tmp_path: Path, make_chunks: MakeChunks, use_mmap: bool
) -> None:
    # Chunks spanning several 1 MiB windows, sizes not multiples of 64 (so
    # the fused sha256 path and its fallback both run).
    chunks, data = make_chunks([(3 << 20) + 5, 64, 1 << 20, 100_001, (2 << 20) - 1])
    out = tmp_path / "out.bin"
    result = merge(chunks, out, fsync=False, mmap=use_mmap)
    assert out.read_bytes() == data
    assert result.checksum == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("use_mmap", [True, False])
def test_lowest_failure_wins_although_the_feeder_runs_ahead(
    tmp_path: Path, make_chunks: MakeChunks, use_mmap: bool
) -> None:
    # Chunk 1's checksum is wrong (found by the hasher, late); chunk 3 is
    # missing (found by the feeder, early): chunk 1 must be reported.
    chunks, _ = make_chunks([1 << 20, 2 << 20, 1000, 1000])
    bad = [chunks[0], Chunk(1, chunks[1].path, chunks[1].size, "0" * 64), chunks[2]]
    bad.append(Chunk(3, str(tmp_path / "gone"), 1000, chunks[3].checksum))
    out = tmp_path / "out" / "o.bin"
    out.parent.mkdir()
    with pytest.raises(ChunkChecksumMismatch) as caught:
        merge(bad, out, fsync=False, mmap=use_mmap)
    assert caught.value.index == 1
    assert os.listdir(out.parent) == []


def test_accepts_dicts_tuples_and_pathlike(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, data = make_chunks([10, 20, 30])
    mixed = [
        {
            "index": 2,
            "path": Path(chunks[2].path),
            "size": 30,
            "checksum": chunks[2].checksum.upper(),
        },
        (0, chunks[0].path, 10, chunks[0].checksum),
        chunks[1],
    ]
    merge(mixed, tmp_path / "out.bin", fsync=False)
    assert (tmp_path / "out.bin").read_bytes() == data
    with pytest.raises(TypeError):
        merge([(0, "x")], tmp_path / "out2.bin")  # type: ignore[list-item]


@pytest.mark.parametrize("algorithm", merge_core.ALGORITHMS)
def test_every_algorithm(tmp_path: Path, make_chunks: MakeChunks, algorithm: str) -> None:
    chunks, data = make_chunks([5000, 3], algorithm=algorithm)
    result = merge(
        chunks, tmp_path / "out.bin", algorithm=algorithm, expected_checksum=digest(data, algorithm)
    )
    assert result.algorithm == algorithm
    assert result.checksum == digest(data, algorithm)


def test_empty_chunk_list_makes_empty_file(tmp_path: Path) -> None:
    result = merge([], tmp_path / "out.bin")
    assert result.size == 0 and (tmp_path / "out.bin").read_bytes() == b""


def test_chunk_checksum_mismatch_attributes(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, _ = make_chunks([100, 100, 100])
    bad = Chunk(1, chunks[1].path, 100, "0" * 64)
    with pytest.raises(ChunkChecksumMismatch) as caught:
        merge([chunks[0], bad, chunks[2]], tmp_path / "out.bin")
    err = caught.value
    assert isinstance(err, MergeError)
    assert (err.index, err.expected, err.path) == (1, "0" * 64, chunks[1].path)
    assert err.actual == chunks[1].checksum
    assert listing(tmp_path) == ["chunks"]


def test_chunk_size_mismatch_attributes(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, _ = make_chunks([100, 100])
    with pytest.raises(ChunkSizeMismatch) as caught:
        merge([chunks[0], Chunk(1, chunks[1].path, 101, chunks[1].checksum)], tmp_path / "out.bin")
    assert (caught.value.index, caught.value.expected, caught.value.actual) == (1, 101, 100)
    assert listing(tmp_path) == ["chunks"]


def test_missing_and_duplicate_indexes(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, _ = make_chunks([1, 2, 3])
    with pytest.raises(MissingChunk) as missing:
        merge([chunks[0], chunks[2]], tmp_path / "out.bin")
    assert missing.value.index == 1
    with pytest.raises(DuplicateChunk) as duplicate:
        merge([chunks[0], chunks[1], chunks[1], chunks[2]], tmp_path / "out.bin")
    assert duplicate.value.index == 1
    assert listing(tmp_path) == ["chunks"]


def test_file_checksum_mismatch(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, data = make_chunks([100, 100])
    with pytest.raises(FileChecksumMismatch) as caught:
        merge(chunks, tmp_path / "out.bin", expected_checksum="f" * 64)
    assert caught.value.actual == hashlib.sha256(data).hexdigest()
    assert caught.value.index is None
    assert listing(tmp_path) == ["chunks"]


def test_io_error_names_the_chunk(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, _ = make_chunks([100, 100])
    os.remove(chunks[1].path)
    with pytest.raises(MergeIOError) as caught:
        merge(chunks, tmp_path / "out.bin")
    assert (caught.value.index, caught.value.errno, caught.value.path) == (1, 2, chunks[1].path)
    assert caught.value.operation == "open"
    assert listing(tmp_path) == ["chunks"]


def test_output_directory_missing_is_io_error(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, _ = make_chunks([10])
    with pytest.raises(MergeIOError) as caught:
        merge(chunks, tmp_path / "nope" / "out.bin")
    assert caught.value.index is None


def test_bad_arguments_are_value_errors(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, _ = make_chunks([10])
    with pytest.raises(ValueError, match="unknown checksum algorithm"):
        merge(chunks, tmp_path / "out.bin", algorithm="md5")
    with pytest.raises(ValueError, match="chunk 0"):
        merge([Chunk(0, chunks[0].path, 10, "xyz")], tmp_path / "out.bin")
    with pytest.raises(ValueError):
        merge(chunks, tmp_path / "out.bin", expected_checksum="abc")
    with pytest.raises(TypeError, match="bool"):
        merge(chunks, tmp_path / "out.bin", drop_behind="yes")  # type: ignore[arg-type]
    assert not (tmp_path / "out.bin").exists()


def test_temp_file_lives_beside_output_and_goes_on_success(
    tmp_path: Path, make_chunks: MakeChunks
) -> None:
    chunks, _ = make_chunks([100_000] * 3)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    seen: list[list[str]] = []
    merge(chunks, out_dir / "out.bin", progress=lambda done, total: seen.append(listing(out_dir)))
    # The first report comes after the temporary file exists, before any byte.
    (temp,) = seen[0]
    assert temp.startswith(".out.bin.") and temp.endswith(".merge-tmp")
    assert listing(out_dir) == ["out.bin"]


def test_temp_file_removed_on_failure(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, _ = make_chunks([100_000] * 3)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "out.bin").write_bytes(b"previous version")
    seen: list[list[str]] = []
    bad = [*chunks[:2], Chunk(2, chunks[2].path, 100_000, "0" * 64)]
    with pytest.raises(ChunkChecksumMismatch):
        merge(bad, out_dir / "out.bin", progress=lambda d, t: seen.append(listing(out_dir)))
    assert any(name.endswith(".merge-tmp") for name in seen[0])
    # The old output is untouched; nothing else is left.
    assert listing(out_dir) == ["out.bin"]
    assert (out_dir / "out.bin").read_bytes() == b"previous version"


def test_progress_reports_and_exceptions(tmp_path: Path, make_chunks: MakeChunks) -> None:
    chunks, data = make_chunks([50_000, 50_000])
    reports: list[tuple[int, int]] = []
    merge(chunks, tmp_path / "out.bin", progress=lambda d, t: reports.append((d, t)))
    assert reports[0] == (0, len(data)) and reports[-1] == (len(data), len(data))
    assert [d for d, _ in reports] == sorted(d for d, _ in reports)

    def explode(done: int, total: int) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        merge(chunks, tmp_path / "out2.bin", progress=explode)
    assert listing(tmp_path) == ["chunks", "out.bin"]


def test_gil_is_released_during_merge(tmp_path: Path, big_chunk_dir) -> None:  # type: ignore[no-untyped-def]
    _, files = big_chunk_dir
    chunks = [Chunk(i, *files[i % 4]) for i in range(64)]  # 256 MiB
    worker = threading.Thread(
        target=merge, args=(chunks, tmp_path / "out.bin", "sha256", None, False)
    )
    spins = 0
    worker.start()
    while worker.is_alive():
        spins += 1
    worker.join()
    # Holding the GIL for the whole merge would leave this loop a handful of turns.
    assert spins > 10_000
    assert (tmp_path / "out.bin").stat().st_size == 256 << 20


def test_hasher_and_checksum_file(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    path = tmp_path / "f"
    path.write_bytes(data)
    for algorithm in merge_core.ALGORITHMS:
        hasher = Hasher(algorithm)
        assert hasher.algorithm == algorithm
        hasher.update(data[:1000])
        copy = hasher.copy()
        hasher.update(memoryview(data)[1000:])
        assert hasher.finalize() == hasher.hexdigest() == checksum_file(path, algorithm)
        assert copy.finalize() == digest(data[:1000], algorithm)
    assert checksum_file(str(path)) == hashlib.sha256(data).hexdigest()
    assert digest(b"123456789", "crc32c") == "e3069283"
    with pytest.raises(ValueError):
        Hasher("md5")
    with pytest.raises(MergeIOError):
        checksum_file(tmp_path / "missing")


def _repeated(big_chunk_dir, count: int) -> tuple[list[Chunk], str]:  # type: ignore[no-untyped-def]
    """`count` chunks cycling over the four 4 MiB files, and their whole sha256."""
    _, files = big_chunk_dir
    chunks = [Chunk(i, *files[i % 4]) for i in range(count)]
    whole = hashlib.sha256()
    for chunk in chunks:
        whole.update(Path(chunk.path).read_bytes())
    return chunks, whole.hexdigest()


@pytest.mark.parametrize(
    ("fsync", "drop_behind"),
    [(False, None), (False, True), (False, False), (True, None), (True, False)],
)
def test_drop_behind_on_or_off_gives_the_same_file(
    tmp_path: Path,
    big_chunk_dir,  # type: ignore[no-untyped-def]
    fsync: bool,
    drop_behind: bool | None,
) -> None:
    # 80 MiB: more than the 64 MiB drop-behind distance, so pages are dropped.
    chunks, expected = _repeated(big_chunk_dir, 20)
    out = tmp_path / "out.bin"
    result = merge(chunks, out, fsync=fsync, drop_behind=drop_behind, expected_checksum=expected)
    assert result.checksum == expected
    assert merge_core.checksum_file(out) == expected
    assert out.stat().st_size == 80 << 20
    assert listing(tmp_path) == ["out.bin"]


def test_a_late_bad_chunk_with_drop_behind_leaves_nothing(
    tmp_path: Path,
    big_chunk_dir,  # type: ignore[no-untyped-def]
) -> None:
    chunks, _ = _repeated(big_chunk_dir, 20)
    # The last chunk is bad: by then the output's first 12 MiB were dropped.
    chunks[19] = Chunk(19, chunks[19].path, chunks[19].size, "0" * 64)
    (tmp_path / "out.bin").write_bytes(b"previous version")
    with pytest.raises(ChunkChecksumMismatch) as caught:
        merge(chunks, tmp_path / "out.bin", fsync=False, drop_behind=True)
    assert caught.value.index == 19
    assert listing(tmp_path) == ["out.bin"]
    assert (tmp_path / "out.bin").read_bytes() == b"previous version"
