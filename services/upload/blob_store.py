"""Where chunk and file bytes live: a small interface and the local-folder store.

Keys are deterministic (`uploads/{upload_id}/{index}`, `files/{file_id}/{version}`), so a
retried write lands on the same object. Writes go to a temporary name, are fsynced and
renamed into place, so a reader never sees a partial object.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from services.common.private_files import FILE_MODE, private_dirs


def chunk_key(upload_id: str, index: int) -> str:
    """The deterministic key of one chunk."""
    return f"uploads/{upload_id}/{index}"


def upload_prefix(upload_id: str) -> str:
    """The key prefix holding every chunk of one upload."""
    return f"uploads/{upload_id}"


def content_key(file_id: str, upload_id: str) -> str:
    """The key of one merged file version (named by the upload that produced it)."""
    return f"files/{file_id}/{upload_id}"


class BlobStore(Protocol):
    """Byte storage addressed by key; an S3-compatible store can implement the same."""

    def stage(self, key: str, data: bytes) -> str:
        """Write `data` durably under a temporary name next to `key`; returns that name."""
        ...

    def publish(self, staged: str, key: str) -> None:
        """Atomically move a staged object to `key`, replacing whatever was there."""
        ...

    def discard(self, staged: str) -> None:
        """Remove a staged object that will not be published."""
        ...

    def path(self, key: str) -> Path:
        """A local path for `key` (merge_core reads and writes files)."""
        ...

    def exists(self, key: str) -> bool:
        """True if an object is stored under `key`."""
        ...

    def read(self, key: str, offset: int = 0, length: int = -1) -> bytes:
        """Bytes of `key` from `offset` (all when `length` is -1)."""
        ...

    def size(self, key: str) -> int:
        """Size in bytes of the object under `key`."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; returns how many were removed."""
        ...


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBlobStore:
    """Objects as files under `root`; temp + fsync + rename for every write."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = private_dirs(Path(root).resolve())
        self._fsync = fsync

    def path(self, key: str) -> Path:
        """The file behind `key`; refuses keys that would escape the root."""
        p = (self.root / key).resolve()
        if self.root not in p.parents:
            raise ValueError(f"blob key escapes the store: {key!r}")
        return p

    def stage(self, key: str, data: bytes) -> str:
        """Write `data` to `.{name}.{random}.tmp` beside `key` and fsync it."""
        final = self.path(key)
        private_dirs(final.parent)
        staged = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
        # 0600 from the first byte (not after a chmod): blobs are every tenant's data.
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with open(fd, "wb") as f:
            f.write(data)
            if self._fsync:
                f.flush()
                os.fsync(f.fileno())
        return str(staged)

    def publish(self, staged: str, key: str) -> None:
        """Rename the staged file over `key` and fsync the directory entry."""
        final = self.path(key)
        os.replace(staged, final)
        if self._fsync:
            _fsync_dir(final.parent)

    def discard(self, staged: str) -> None:
        """Remove a staged file (missing is fine)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)

    def exists(self, key: str) -> bool:
        """True if a file is stored under `key`."""
        return self.path(key).is_file()

    def read(self, key: str, offset: int = 0, length: int = -1) -> bytes:
        """Read `length` bytes (all when -1) of `key` from `offset`."""
        with open(self.path(key), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def iter_read(self, key: str, offset: int, block: int) -> Iterator[bytes]:
        """Yield `key`'s bytes from `offset` in blocks of `block`."""
        with open(self.path(key), "rb") as f:
            f.seek(offset)
            while data := f.read(block):
                yield data

    def size(self, key: str) -> int:
        """Size of the file under `key`."""
        return self.path(key).stat().st_size

    def delete_prefix(self, prefix: str) -> int:
        """Delete the folder behind `prefix`; returns the number of files removed."""
        folder = self.path(prefix)
        if not folder.is_dir():
            return 0
        count = sum(1 for p in folder.rglob("*") if p.is_file())
        shutil.rmtree(folder, ignore_errors=True)
        return count
