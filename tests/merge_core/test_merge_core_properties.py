"""Property-based tests of merge_core.merge (hypothesis).

Random chunk counts and sizes, including empty chunks and one-chunk files:
the output is the concatenation in index order whatever the input order; any
corrupted byte is caught with its chunk's index and leaves no output; index
sets that are not exactly 0..N-1 are refused with the lowest bad index.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import merge_core
from merge_core import Chunk, ChunkChecksumMismatch, DuplicateChunk, MissingChunk, merge

# Sizes around the pipeline's block (256 KiB) and write (128 KiB) boundaries
# matter most; keep most of them small so the suite stays fast.
sizes_strategy = st.lists(
    st.one_of(
        st.integers(0, 64),
        st.integers(0, 70_000),
        st.sampled_from([131_071, 131_072, 262_143, 262_144, 262_145, 600_000]),
    ),
    min_size=0,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    sizes=sizes_strategy,
    algorithm=st.sampled_from(merge_core.ALGORITHMS),
    seed=st.integers(0, 2**32 - 1),
    fsync=st.booleans(),
    use_mmap=st.booleans(),
)
def test_output_is_concatenation_in_index_order(
    chunk_writer, sizes: list[int], algorithm: str, seed: int, fsync: bool, use_mmap: bool
) -> None:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as tmp:
        chunks, data = chunk_writer(Path(tmp) / "chunks", sizes, algorithm, seed)
        shuffled = list(chunks)
        random.Random(seed).shuffle(shuffled)
        out = Path(tmp) / "out.bin"
        result = merge(shuffled, out, algorithm=algorithm, fsync=fsync, mmap=use_mmap)
        assert out.read_bytes() == data
        assert result.size == len(data) and result.chunk_count == len(sizes)
        if algorithm == "sha256":
            assert result.checksum == hashlib.sha256(data).hexdigest()
        # Same inputs in index order: same result.
        again = merge(chunks, Path(tmp) / "again.bin", algorithm=algorithm, fsync=False)
        assert again.checksum == result.checksum
        assert sorted(os.listdir(tmp)) == ["again.bin", "chunks", "out.bin"]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300_000), min_size=1, max_size=6),
    algorithm=st.sampled_from(merge_core.ALGORITHMS),
    data=st.data(),
    use_mmap=st.booleans(),
)
def test_any_corrupted_byte_is_caught(  # type: ignore[no-untyped-def]
    chunk_writer, sizes: list[int], algorithm: str, data, use_mmap: bool
) -> None:
    victim = data.draw(st.integers(0, len(sizes) - 1), label="chunk")
    offset = data.draw(st.integers(0, sizes[victim] - 1), label="offset")
    flip = data.draw(st.integers(1, 255), label="xor")
    with tempfile.TemporaryDirectory() as tmp:
        chunks, _ = chunk_writer(Path(tmp) / "chunks", sizes, algorithm)
        path = Path(chunks[victim].path)
        raw = bytearray(path.read_bytes())
        raw[offset] ^= flip
        path.write_bytes(raw)
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        with pytest.raises(ChunkChecksumMismatch) as caught:
            merge(
                chunks[::-1], out_dir / "out.bin", algorithm=algorithm, fsync=False, mmap=use_mmap
            )
        assert caught.value.index == victim
        assert caught.value.expected == chunks[victim].checksum
        assert os.listdir(out_dir) == []


def lowest_problem(indexes: list[int]) -> tuple[type[Exception], int] | None:
    """What merge must say about these indexes: the lowest bad one."""
    counts = Counter(indexes)
    for expected in range(len(indexes)):
        if counts[expected] == 0:
            return MissingChunk, expected
        if counts[expected] > 1:
            return DuplicateChunk, expected
    return None


@settings(max_examples=100, deadline=None)
@given(indexes=st.lists(st.integers(0, 12), min_size=1, max_size=10))
def test_index_sets_must_be_exactly_0_to_n_minus_1(chunk_writer, indexes: list[int]) -> None:  # type: ignore[no-untyped-def]
    problem = lowest_problem(indexes)
    with tempfile.TemporaryDirectory() as tmp:
        (source,), _ = chunk_writer(Path(tmp) / "chunks", [3])
        chunks = [Chunk(i, source.path, source.size, source.checksum) for i in indexes]
        out = Path(tmp) / "out.bin"
        if problem is None:
            assert merge(chunks, out, fsync=False).chunk_count == len(indexes)
            return
        kind, index = problem
        with pytest.raises(kind) as caught:
            merge(chunks, out, fsync=False)
        assert caught.value.index == index  # type: ignore[attr-defined]
        assert not out.exists()
