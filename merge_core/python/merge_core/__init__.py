"""merge_core: ordered chunk merge with streaming checksum checks.

Rust does the bytes, the ordering and the checksums; this package is the
typed Python face of it. See `merge` for the guarantees.

    from merge_core import Chunk, merge
    result = merge([Chunk(0, "c0", 5, "..."), Chunk(1, "c1", 3, "...")], "out.bin")

`StreamingMerge` runs the same checks over bytes the caller feeds in index order
(chunks held in an object store), so no chunk has to be copied to a local file:

    m = StreamingMerge([Chunk(0, "key0", 5, "..."), Chunk(1, "key1", 3, "...")])
    m.update(first_bytes); m.end_chunk(); m.update(second_bytes); m.end_chunk()
    size, checksum, algorithm, chunk_count = m.finish()
"""

from merge_core._merge import Chunk, ChunkLike, MergeResult, as_chunk, merge
from merge_core._merge_core import (
    ALGORITHMS,
    BUFFER_BUDGET,
    DROP_BEHIND_FROM,
    ChunkChecksumMismatch,
    ChunkSizeMismatch,
    DuplicateChunk,
    FileChecksumMismatch,
    Hasher,
    MergeError,
    MergeIOError,
    MissingChunk,
    StreamingMerge,
    __version__,
    checksum_file,
    put_file,
    write_chunk,
)

__all__ = [
    "ALGORITHMS",
    "BUFFER_BUDGET",
    "DROP_BEHIND_FROM",
    "Chunk",
    "ChunkChecksumMismatch",
    "ChunkLike",
    "ChunkSizeMismatch",
    "DuplicateChunk",
    "FileChecksumMismatch",
    "Hasher",
    "MergeError",
    "MergeIOError",
    "MergeResult",
    "MissingChunk",
    "StreamingMerge",
    "__version__",
    "as_chunk",
    "checksum_file",
    "merge",
    "put_file",
    "write_chunk",
]
