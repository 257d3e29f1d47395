"""Stub for the Rust extension (kept honest by `mypy.stubtest merge_core`)."""

import os
from collections.abc import Callable, Sequence
from typing import Protocol, final

from typing_extensions import Buffer

__all__ = [
    "ALGORITHMS",
    "BUFFER_BUDGET",
    "DROP_BEHIND_FROM",
    "ChunkChecksumMismatch",
    "ChunkSizeMismatch",
    "DuplicateChunk",
    "FileChecksumMismatch",
    "Hasher",
    "MergeError",
    "MergeIOError",
    "MissingChunk",
    "StreamingMerge",
    "__version__",
    "checksum_file",
    "merge",
    "put_file",
    "write_chunk",
]

__version__: str
ALGORITHMS: tuple[str, ...]
BUFFER_BUDGET: int
DROP_BEHIND_FROM: int

class _ChunkFields(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def path(self) -> str | os.PathLike[str]: ...
    @property
    def size(self) -> int: ...
    @property
    def checksum(self) -> str: ...

class MergeError(Exception):
    """Root of every merge_core error."""

    index: int | None

class ChunkChecksumMismatch(MergeError):
    index: int
    expected: str
    actual: str
    path: str

class ChunkSizeMismatch(MergeError):
    index: int
    expected: int
    actual: int
    path: str

class MissingChunk(MergeError):
    index: int

class DuplicateChunk(MergeError):
    index: int

class FileChecksumMismatch(MergeError):
    index: None
    expected: str
    actual: str

class MergeIOError(MergeError):
    errno: int | None
    path: str
    operation: str

@final
class Hasher:
    """Streaming checksum; `finalize()` returns lowercase hex, state kept."""

    def __new__(cls, algorithm: str = "sha256") -> Hasher: ...
    @property
    def algorithm(self) -> str: ...
    def update(self, data: Buffer) -> None: ...
    def finalize(self) -> str: ...
    def hexdigest(self) -> str: ...
    def copy(self) -> Hasher: ...

@final
class StreamingMerge:
    """Ordered, verified merge fed block by block (bytes from an object store, say)."""

    def __new__(
        cls,
        chunks: Sequence[_ChunkFields],
        algorithm: str = "sha256",
        expected_checksum: str | None = None,
    ) -> StreamingMerge: ...
    @property
    def next_index(self) -> int | None: ...
    @property
    def bytes_done(self) -> int: ...
    @property
    def total_size(self) -> int: ...
    @property
    def algorithm(self) -> str: ...
    def update(self, data: Buffer) -> None: ...
    def end_chunk(self) -> int: ...
    def finish(self) -> tuple[int, str, str, int]: ...

def checksum_file(path: str | os.PathLike[str], algorithm: str = "sha256") -> str: ...
def write_chunk(
    path: str | os.PathLike[str],
    data: Buffer,
    algorithm: str = "sha256",
    expected: str | None = None,
    fsync: bool = True,
) -> str: ...
def put_file(
    path: str | os.PathLike[str],
    staged: str | os.PathLike[str],
    data: Buffer,
    fsync: bool = True,
    folders: Sequence[str | os.PathLike[str]] | None = None,
) -> None: ...
def merge(
    chunks: Sequence[_ChunkFields],
    output_path: str | os.PathLike[str],
    algorithm: str = "sha256",
    expected_checksum: str | None = None,
    fsync: bool = True,
    progress: Callable[[int, int], object] | None = None,
    mmap: bool = False,
    drop_behind: bool | None = None,
) -> tuple[str, int, str, str, int]: ...
