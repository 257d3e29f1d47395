"""The blob store interface every backend implements, and the keys it is addressed by.

Keys are deterministic (`uploads/{upload_id}/{index}`, `files/{file_id}/{upload_id}`), so a
retried write lands on the same object. Every method is a coroutine: the local store runs
its file I/O on worker threads, the S3 store awaits the network. Guarantees each backend
keeps:

- A chunk write is all-or-nothing: `stage` prepares the bytes, `publish` makes them visible
  under the key in one atomic step (a rename, or one PUT), `discard` drops what was staged.
- `merge` reads the chunks in index order, verifies every chunk's size and checksum and
  the whole file's while streaming (merge_core), with bounded memory, and makes the output
  visible under its key only once everything verified: on failure nothing is there.
  Verification failures raise merge_core's exceptions (`ChunkChecksumMismatch`, ...);
  store trouble raises `merge_core.MergeIOError` (local) or `BlobStoreUnavailable` (remote).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


def chunk_key(upload_id: str, index: int) -> str:
    """The deterministic key of one chunk."""
    return f"uploads/{upload_id}/{index}"


def upload_prefix(upload_id: str) -> str:
    """The key prefix holding every chunk of one upload."""
    return f"uploads/{upload_id}"


def content_key(file_id: str, upload_id: str) -> str:
    """The key of one merged file version (named by the upload that produced it)."""
    return f"files/{file_id}/{upload_id}"


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One stored chunk to merge: its index, key and what it must hold."""

    index: int
    key: str
    size: int
    checksum: str


@dataclass(frozen=True, slots=True)
class Merged:
    """A verified merge: the whole file's size and checksum."""

    key: str
    size: int
    checksum: str
    algorithm: str
    chunk_count: int


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One listed object: its key, size and last write (UTC). `temporary` marks a write in
    progress or abandoned (a local `.*.tmp` / `.*.merge-tmp` file; never on S3)."""

    key: str
    size: int
    modified: datetime
    temporary: bool = False


class BlobStore(Protocol):
    """Byte storage addressed by key (the local folder or an S3-compatible bucket)."""

    async def put(self, key: str, data: bytes) -> None:
        """Store `data` as the object under `key`, replacing any: durable when this returns,
        and a reader sees all of it or none (`stage` + `publish` in one step)."""
        ...

    async def stage(self, key: str, data: bytes) -> object:
        """Prepare `data` for `key` without making it visible; returns a staging handle."""
        ...

    async def stage_checked(
        self, key: str, data: bytes, algorithm: str, expected: str
    ) -> tuple[object | None, str]:
        """`stage` with the bytes hashed by `algorithm` on the way: (the staging handle, or
        None when the digest is not `expected` and nothing is staged; the digest)."""
        ...

    async def publish(self, staged: object, key: str) -> None:
        """Atomically make the staged bytes the object under `key`, replacing any."""
        ...

    async def publish_many(self, items: Sequence[tuple[object, str]]) -> None:
        """`publish` for every (staged, key) pair, as one step where the store allows it
        (the local store fsyncs each folder once); a failure may leave some published."""
        ...

    async def discard(self, staged: object) -> None:
        """Drop what `stage` prepared (after a publish, or instead of one; idempotent)."""
        ...

    async def exists(self, key: str) -> bool:
        """True if an object is stored under `key`."""
        ...

    async def size(self, key: str) -> int:
        """Size in bytes of the object under `key`."""
        ...

    async def read(self, key: str, offset: int = 0, length: int = -1) -> bytes:
        """Bytes of `key` from `offset` (all when `length` is -1)."""
        ...

    def iter_read(self, key: str, offset: int, block: int) -> AsyncIterator[bytes]:
        """`key`'s bytes from `offset` in blocks of at most `block` (range reads)."""
        ...

    async def copy(self, source: str, key: str) -> None:
        """Make a copy of the object under `source` the object under `key`: all of it
        appears at once or nothing does (a restored version's own content, RestoreVersion).
        FileNotFoundError when `source` is missing."""
        ...

    async def delete(self, key: str) -> None:
        """Delete the object under `key` (missing is fine)."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; returns how many were removed."""
        ...

    def list_objects(self, prefix: str) -> AsyncIterator[StoredObject]:
        """Every object under `prefix/`, temporary files included (the orphan sweep)."""
        ...

    async def merge(
        self,
        chunks: Sequence[ChunkRef],
        key: str,
        algorithm: str,
        expected_checksum: str | None,
    ) -> Merged:
        """Concatenate `chunks` (indexes 0..N-1) into `key`, verified (module docstring)."""
        ...

    async def abort_unfinished(self, before: datetime) -> int:
        """Abort merge output left unfinished by a killed merge and started before `before`
        (S3: multipart uploads, which no listing of objects shows; local: none, its temp
        files are listed objects); returns how many."""
        ...

    async def checksum(self, key: str, algorithm: str) -> str:
        """Lowercase hex checksum of the object under `key`, read back from the store."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
