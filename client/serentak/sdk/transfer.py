"""File transfer helpers of the SDK: chunk layout, request ids, atomic destination files."""

# Client-side file I/O of one user's process: blocking reads and writes are fine here.

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

DEFAULT_CHUNK_SIZE = 8 * 1024 * 1024


def chunk_count(size: int, chunk_size: int) -> int:
    """Chunks a file of `size` bytes takes (at least one: an empty file is one empty chunk)."""
    return max(1, -(-size // chunk_size))


def chunk_length(index: int, chunk_size: int, size: int) -> int:
    """Bytes chunk `index` holds."""
    return max(0, min(chunk_size, size - index * chunk_size))


def upload_request_id(path: Path, chunk_size: int, target: str) -> str:
    """A client_request_id stable across re-runs for the same file, layout and target.

    The file's resolved path, size and mtime stand for its content; `target` (the folder
    and name, or the file a new version goes to) keeps an upload of the same bytes
    elsewhere from being taken for this one.
    """
    st = path.stat()
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{chunk_size}:{target}"
    return hashlib.sha256(key.encode()).hexdigest()[:40]


@contextlib.contextmanager
def atomic_destination(dest: Path) -> Iterator[BinaryIO]:
    """A temporary file beside `dest`, renamed over it only if the block succeeds.

    On any failure the temporary file is removed, so nothing is left at `dest` (nor a
    partial file beside it). The data is fsynced before the rename.
    """
    directory = dest.parent if str(dest.parent) else Path(".")
    if not directory.is_dir():
        raise FileNotFoundError(f"no such directory: {directory}")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
