"""The durable tail: bytes of a tus upload's chunk not yet complete, staged on local disk.

One file per upload and chunk index, `{root}/{tus_id}.{index}`, always replaced whole
(temp file + fsync + rename + directory fsync), so after a crash a tail is either the
last one written or absent, never torn. The index in the name ties a tail to the chunk it
belongs to: once that chunk is stored (by this replica or another) the tail is stale and
ignored, so a replica's tails can never make an offset run ahead of the stored chunks.
A tail is local to the replica that wrote it; a request on another replica sees the
offset of the last whole chunk and the client resends from there (tus resumes by HEAD).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path


class Tails:
    """Staged tails under one folder (`UploadSettings.tus_root`)."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = root
        self._fsync = fsync
        # Users' bytes: private whatever the umask, as the blob store's are.
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)

    def _path(self, tus_id: str, index: int) -> Path:
        return self.root / f"{tus_id}.{index}"

    def size(self, tus_id: str, index: int) -> int:
        """Bytes staged for chunk `index` (0 when none): one stat, no read."""
        try:
            return self._path(tus_id, index).stat().st_size
        except FileNotFoundError:
            return 0

    async def read(self, tus_id: str, index: int) -> bytes:
        """The bytes staged for chunk `index` (empty when none)."""

        def read() -> bytes:
            try:
                return self._path(tus_id, index).read_bytes()
            except FileNotFoundError:
                return b""

        return await asyncio.to_thread(read)

    async def write(self, tus_id: str, index: int, data: bytes) -> None:
        """Make `data` the tail of chunk `index`, durably and atomically."""
        await asyncio.to_thread(self._write, self._path(tus_id, index), data)

    def _write(self, path: Path, data: bytes) -> None:
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                out.write(data)
                out.flush()
                if self._fsync:
                    os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        if self._fsync:
            folder = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)

    async def remove(self, tus_id: str, below: int | None = None) -> None:
        """Remove the upload's tails (only those of chunks before `below` when given)."""

        def remove() -> None:
            for path in self.root.glob(f"{tus_id}.*"):
                index = path.name.rpartition(".")[2]
                if below is None or (index.isdigit() and int(index) < below):
                    path.unlink(missing_ok=True)

        await asyncio.to_thread(remove)

    async def sweep(self, max_age_seconds: float) -> int:
        """Remove tails and temp files untouched for `max_age_seconds` (an upload that
        expired, or one finished on another replica); returns how many."""

        def sweep() -> int:
            cutoff = time.time() - max_age_seconds
            removed = 0
            for path in self.root.iterdir():
                try:
                    if path.stat().st_mtime < cutoff:
                        path.unlink(missing_ok=True)
                        removed += 1
                except FileNotFoundError:
                    continue
            return removed

        return await asyncio.to_thread(sweep)
