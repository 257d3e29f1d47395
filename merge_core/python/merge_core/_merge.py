"""The public merge API over the Rust core (`merge_core._merge_core`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeAlias

from merge_core import _merge_core


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk file to merge; mirrors the Rust `Chunk` field for field.

    `index` alone decides where the chunk goes (never `path` or the order
    chunks are given in); `size` and `checksum` (lowercase or uppercase hex of
    the merge's algorithm) are what the file must hold.
    """

    index: int
    path: str | os.PathLike[str]
    size: int
    checksum: str


ChunkLike: TypeAlias = Chunk | Mapping[str, Any] | tuple[int, "str | os.PathLike[str]", int, str]
"""A `Chunk`, a mapping with its four keys, or an `(index, path, size, checksum)` tuple."""


@dataclass(frozen=True, slots=True)
class MergeResult:
    """What a successful merge produced.

    `checksum` is the whole file's, in lowercase hex of `algorithm`; `size`
    is in bytes; `duration_seconds` is the wall time of the merge call.
    """

    output_path: str
    size: int
    checksum: str
    algorithm: str
    chunk_count: int
    duration_seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict."""
        return asdict(self)


def as_chunk(value: ChunkLike) -> Chunk:
    """Accepts a `Chunk`, a mapping or a 4-tuple; raises `TypeError` otherwise."""
    if isinstance(value, Chunk):
        return value
    if isinstance(value, Mapping):
        try:
            return Chunk(
                index=value["index"],
                path=value["path"],
                size=value["size"],
                checksum=value["checksum"],
            )
        except KeyError as missing:
            raise TypeError(f"chunk mapping lacks key {missing}") from None
    if isinstance(value, tuple) and len(value) == 4:
        return Chunk(*value)
    raise TypeError(f"not a chunk: {value!r}")


def merge(
    chunks: Iterable[ChunkLike],
    output_path: str | os.PathLike[str],
    algorithm: str = "sha256",
    expected_checksum: str | None = None,
    fsync: bool = True,
    *,
    progress: Callable[[int, int], object] | None = None,
    mmap: bool = False,
    drop_behind: bool | None = None,
) -> MergeResult:
    """Concatenate chunk files in index order into `output_path`, verified.

    Guarantees:

    * Order is by `index` only. The indexes must be exactly `0..N-1`;
      otherwise `MissingChunk` (lowest absent index) or `DuplicateChunk`, and
      nothing is read or written. No chunks at all makes an empty file.
    * While streaming, every chunk's size and checksum are verified and the
      whole file's checksum is computed (and compared with
      `expected_checksum` if given). The first failing chunk, by index, is
      reported: `ChunkSizeMismatch` / `ChunkChecksumMismatch` with `index`,
      `expected`, `actual`, `path`; `FileChecksumMismatch`; `MergeIOError`
      (with `errno`, `path`, `operation`, and `index` for a chunk file).
      All derive from `MergeError`. Malformed arguments (unknown algorithm,
      checksum that is not hex of the right length) raise `ValueError`.
    * Output goes to a temporary file in `output_path`'s directory (named
      `.<name>.<pid>-...merge-tmp`), is fsynced, renamed over `output_path`
      atomically, and the directory is fsynced. On any failure the temporary
      file is removed: no partial output is ever visible at `output_path`
      (a SIGKILL can leave the temporary file, never a partial output).
      With `fsync=False` the rename is still atomic but nothing is fsynced.
    * Memory is bounded by `BUFFER_BUDGET` bytes of buffers (or of mapped
      chunk pages, which count toward RSS while mapped), whatever the size.
    * The GIL is released for the whole merge. A second thread maps (or
      reads) the chunks and writes them; the calling thread computes the
      whole-file checksum and, fused with it (sha256 with SHA-NI), the
      chunks' checksums, except for chunks the writing thread hashes when it
      has measured idle time to spare (it waits on the calling thread, and
      neither thread is waiting for a CPU: on a busy machine it takes none).
    * `drop_behind` (keyword-only): output pages are dropped from the page
      cache 64 MiB behind the writer (durable merges wait for their
      writeback first; page-cache merges start writeback and drop what is
      already clean, never waiting for the disk). `None`
      (default): always when `fsync=True`; with `fsync=False`, for merges of
      at least `DROP_BEHIND_FROM` bytes (2 GiB). `True`: always. `False`:
      never (the merged file stays cached). Trade-off: on a VM whose fresh
      page-cache pages are faulted in from the host, reusing a few hot pages
      made 4 GiB page-cache merges ~2x faster (README "Measured"); the
      merged file is then not cached afterwards (reading it back goes to
      disk), and its writeback starts during the merge instead of up to
      ~30 s later. For `fsync=False` nothing waits for durability at the
      end, so its semantics are unchanged: the rename is atomic, the data
      is not guaranteed durable. Output bytes and checksums are the same
      either way, and a failed merge still leaves nothing at
      `output_path`.
    * `mmap=False` (default) read()s chunks into private buffers: what is
      written is exactly what was hashed, whatever happens to the files, and
      an I/O error reading a chunk raises `MergeIOError`.
      `mmap=True` maps chunk files and writes the output from the same mapped
      pages that are hashed (no read() copy). This assumes chunk files are not
      modified in place or truncated while the merge runs: a chunk file
      rewritten in place during the merge could make the output differ from
      what was verified, and one truncated while mapped, or a disk error on a
      mapped page, raises SIGBUS, which kills the process. On this project's
      VM both run at the same speed (reading 1.00-1.04x mapping); elsewhere
      mapping may save a copy's CPU. Chunks that cannot be mapped are read.
    * `progress(bytes_done, bytes_total)`, if given, is called from the
      calling thread at most ~4 times a second (and at start and end),
      briefly re-taking the GIL; pending signals are checked then too, so
      Ctrl-C interrupts a merge. An exception from it stops the merge,
      removes the temporary file and propagates.
    """
    normalized = [as_chunk(c) for c in chunks]
    started = time.perf_counter()
    path, size, checksum, algo, count = _merge_core.merge(
        normalized,
        os.fspath(output_path),
        algorithm,
        expected_checksum,
        fsync,
        progress,
        mmap,
        drop_behind,
    )
    return MergeResult(
        output_path=path,
        size=size,
        checksum=checksum,
        algorithm=algo,
        chunk_count=count,
        duration_seconds=time.perf_counter() - started,
    )
