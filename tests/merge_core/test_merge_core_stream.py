"""merge_core.StreamingMerge: the file merge's verdicts over bytes fed in index order."""

from __future__ import annotations

import os
import threading
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
    MissingChunk,
    StreamingMerge,
    merge,
)


def digest(data: bytes, algorithm: str = "sha256") -> str:
    hasher = Hasher(algorithm)
    hasher.update(data)
    return hasher.finalize()


def specs(parts: list[bytes], algorithm: str = "sha256") -> list[Chunk]:
    """Chunks named by object-store-like keys, given in reverse (order is by index)."""
    return [Chunk(i, f"uploads/u/{i}", len(p), digest(p, algorithm)) for i, p in enumerate(parts)][
        ::-1
    ]


def feed(m: StreamingMerge, parts: list[bytes], block: int = 1000) -> None:
    for i, part in enumerate(parts):
        assert m.next_index == i
        view = memoryview(part)
        for start in range(0, len(part), block):
            m.update(view[start : start + block])
        assert m.end_chunk() == i


@pytest.mark.parametrize("algorithm", merge_core.ALGORITHMS)
def test_same_result_as_the_file_merge(tmp_path: Path, algorithm: str) -> None:
    parts = [os.urandom(n) for n in (5000, 1, 0, 70_000, 333)]
    files = []
    for i, part in enumerate(parts):
        path = tmp_path / f"c{i}"
        path.write_bytes(part)
        files.append(Chunk(i, path, len(part), digest(part, algorithm)))
    on_disk = merge(files, tmp_path / "out", algorithm)
    whole = b"".join(parts)
    m = StreamingMerge(specs(parts, algorithm), algorithm, digest(whole, algorithm).upper())
    assert (m.algorithm, m.total_size, m.bytes_done) == (algorithm, len(whole), 0)
    feed(m, parts)
    assert m.next_index is None and m.bytes_done == len(whole)
    assert m.finish() == (on_disk.size, on_disk.checksum, algorithm, 5)
    assert "StreamingMerge" in repr(m)


def test_missing_and_duplicate_indexes_raise_the_file_merge_exceptions() -> None:
    parts = [b"a" * 10, b"b" * 10, b"c" * 10]
    chunks = specs(parts)
    with pytest.raises(MissingChunk) as missing:
        StreamingMerge([c for c in chunks if c.index != 1])
    assert missing.value.index == 1
    with pytest.raises(DuplicateChunk) as duplicate:
        StreamingMerge([*chunks, chunks[0]])
    assert duplicate.value.index == 2
    m = StreamingMerge(chunks)
    m.update(parts[0])
    m.end_chunk()
    with pytest.raises(MissingChunk) as never_fed:
        m.finish()
    assert never_fed.value.index == 1


def test_a_corrupt_chunk_names_its_key_and_poisons_the_merge() -> None:
    parts = [os.urandom(100) for _ in range(3)]
    chunks = specs(parts)
    corrupt = list(parts)
    corrupt[1] = bytes([parts[1][0] ^ 1]) + parts[1][1:]
    m = StreamingMerge(chunks)
    with pytest.raises(ChunkChecksumMismatch) as caught:
        feed(m, corrupt, block=64)
    err = caught.value
    assert isinstance(err, MergeError)
    assert (err.index, err.path) == (1, "uploads/u/1")
    assert err.expected == digest(parts[1]) and err.actual == digest(corrupt[1])
    with pytest.raises(ValueError, match="already failed"):
        m.update(b"x")


def test_sizes_are_checked_as_bytes_arrive() -> None:
    parts = [b"x" * 10, b"y" * 10]
    m = StreamingMerge(specs(parts))
    m.update(b"x" * 8)
    with pytest.raises(ChunkSizeMismatch) as too_long:
        m.update(b"x" * 3)
    assert (too_long.value.index, too_long.value.expected, too_long.value.actual) == (0, 10, 11)
    m = StreamingMerge(specs(parts))
    m.update(b"x" * 9)
    with pytest.raises(ChunkSizeMismatch) as too_short:
        m.end_chunk()
    assert (too_short.value.expected, too_short.value.actual) == (10, 9)


def test_a_wrong_whole_file_checksum_fails_at_finish() -> None:
    parts = [b"x" * 10, b"y" * 10]
    m = StreamingMerge(specs(parts), "sha256", digest(b"other"))
    feed(m, parts)
    with pytest.raises(FileChecksumMismatch) as caught:
        m.finish()
    assert caught.value.index is None
    assert caught.value.actual == digest(b"".join(parts))


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError):
        StreamingMerge([], "md5")
    with pytest.raises(ValueError):
        StreamingMerge([], "sha256", "not-hex")
    with pytest.raises(ValueError):
        StreamingMerge([Chunk(0, "k", 1, "zz")])
    m = StreamingMerge([])
    with pytest.raises(ValueError, match="after the last chunk"):
        m.update(b"x")


def test_gil_is_released_while_hashing() -> None:
    block = os.urandom(64 << 20)
    m = StreamingMerge([Chunk(0, "k", len(block) * 4, "0" * 64)])
    worker = threading.Thread(target=lambda: [m.update(block) for _ in range(4)])
    spins = 0
    worker.start()
    while worker.is_alive():
        spins += 1
    worker.join()
    # Holding the GIL for 256 MiB of sha256 would leave this loop a handful of turns.
    assert spins > 10_000
    assert m.bytes_done == len(block) * 4
