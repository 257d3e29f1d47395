"""Fixtures for merge_core tests: chunk files made on disk."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from merge_core import Chunk, Hasher


def digest(data: bytes, algorithm: str = "sha256") -> str:
    hasher = Hasher(algorithm)
    hasher.update(data)
    return hasher.finalize()


def write_chunks(
    directory: Path, sizes: Sequence[int], algorithm: str = "sha256", seed: int = 0
) -> tuple[list[Chunk], bytes]:
    """Writes one file per size; names sort unlike indexes on purpose."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    chunks, parts = [], []
    for index, size in enumerate(sizes):
        data = rng.randbytes(size)
        path = directory / f"part-{len(sizes) - index:04d}"
        path.write_bytes(data)
        chunks.append(Chunk(index, str(path), size, digest(data, algorithm)))
        parts.append(data)
    return chunks, b"".join(parts)


WriteChunks = Callable[..., tuple[list[Chunk], bytes]]
MakeChunks = Callable[..., tuple[list[Chunk], bytes]]


@pytest.fixture(scope="session")
def chunk_writer() -> WriteChunks:
    """`write_chunks(directory, sizes, algorithm="sha256", seed=0)`, for tests
    (like hypothesis ones) that make their own directories."""
    return write_chunks


@pytest.fixture
def make_chunks(tmp_path: Path) -> MakeChunks:
    def make(
        sizes: Sequence[int], algorithm: str = "sha256", seed: int = 0
    ) -> tuple[list[Chunk], bytes]:
        return write_chunks(tmp_path / "chunks", sizes, algorithm, seed)

    return make


@pytest.fixture(scope="session")
def big_chunk_dir(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[tuple[str, int, str]]]:
    """Four 4 MiB chunk files, for merges that repeat them to reach GiBs."""
    directory = tmp_path_factory.mktemp("big")
    files = []
    for i in range(4):
        data = os.urandom(4 << 20)
        path = directory / f"big{i}"
        path.write_bytes(data)
        files.append((str(path), len(data), hashlib.sha256(data).hexdigest()))
    return directory, files
