"""The local-folder blob store: objects as files under one root (the embedded default).

Writes go to a temporary name, are fsynced and renamed into place, so a reader never sees
a partial object. File I/O and merge_core run on worker threads (merge_core releases the
GIL), so an fsync never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import stat
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import merge_core
from services.common.private_files import FILE_MODE, private_dirs
from services.upload.storage.blob_store.base import ChunkRef, Merged, StoredObject

# merge_core's temporary output beside the final name: `.{name}.{pid}-...merge-tmp`.
MERGE_TMP_SUFFIX = ".merge-tmp"
# Bytes per read and write of a copy (bounded memory whatever the object's size).
COPY_BLOCK = 1024 * 1024
# Folders remembered as durable in their parents; past this many, all are forgotten (each
# then costs one more parent fsync on its next write).
DURABLE_FOLDERS_KEPT = 65_536


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _os_error(exc: merge_core.MergeIOError) -> OSError:
    """The OSError a Python write raises (a full disk then answers RESOURCE_EXHAUSTED)."""
    if exc.errno is None:
        return OSError(str(exc))
    return OSError(exc.errno, os.strerror(exc.errno), str(exc.path))


class LocalBlobStore:
    """Objects as files under `root`; temp + fsync + rename for every write."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        root = Path(root).resolve()
        # The folders private_dirs is about to make: the root and its missing parents.
        made = list(itertools.takewhile(lambda f: not f.exists(), (root, *root.parents)))
        self.root = private_dirs(root)
        if fsync:
            # The root's entry in its parent, and each folder made for it in its own: what
            # `_durable_entries` does below the root, once at start.
            for folder in made or [root]:
                _fsync_dir(folder.parent)
        self._inside = os.path.join(str(self.root), "")  # the root, with a trailing "/"
        self._fsync = fsync
        # Folders under the root whose entries (theirs and their parents', up to the root)
        # this process has fsynced: `_durable_entries`.
        self._durable: dict[str, None] = {}

    def path(self, key: str) -> Path:
        """The file behind `key`; refuses keys that would escape the root.

        Keys are the service's own (ids it made); the check is on the normalised path, with
        no file system call: every write resolves two paths, and a symlink inside the
        store's private 0700 root is not something a caller can make."""
        p = os.path.normpath(os.path.join(self._inside, key))
        if not p.startswith(self._inside):
            raise ValueError(f"blob key escapes the store: {key!r}")
        return Path(p)

    async def put(self, key: str, data: bytes) -> None:
        """Temp + fsync + rename + folder fsyncs, in one merge_core call on a thread: the
        thread takes the GIL back once, not after each system call (a busy event loop
        made those waits, not the I/O, a small file's slowest step)."""
        final = self.path(key)
        folder = final.parent
        # The entries `_durable_entries` would fsync, named here, marked once durable.
        fresh = self._fresh_folders(folder) if self._fsync else []
        staged = folder / f".{final.name}.{uuid.uuid4().hex}.tmp"
        try:
            await asyncio.to_thread(
                merge_core.put_file,
                final,
                staged,
                data,
                self._fsync,
                [parent for _, parent in fresh],
            )
        except merge_core.MergeIOError as exc:
            raise _os_error(exc) from exc
        self._mark_durable(current for current, _ in fresh)

    async def stage(self, key: str, data: bytes) -> object:
        """Write `data` beside `key` under a temporary name, fsynced (on a thread)."""
        return await asyncio.to_thread(self.stage_sync, key, data)

    def _staging_path(self, key: str) -> Path:
        """A new `.{name}.{random}.tmp` beside `key` (its folders made, private)."""
        final = self.path(key)
        private_dirs(final.parent)
        return final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"

    def _durable_entries(self, folder: Path) -> None:
        """Fsync `folder`'s entry in its parent, and so on up to the root, for each folder
        this process has not made durable yet (made anew after `delete_prefix` too): a
        file fsynced in a folder whose own entry is not can vanish with it on a crash.
        Called after `folder` itself was fsynced, so on ext4 the journal commit that made
        its contents durable has taken the mkdir along, and these cost next to nothing."""
        for current, parent in self._fresh_folders(folder):
            _fsync_dir(parent)
            self._mark_durable((current,))

    def _fresh_folders(self, folder: Path) -> list[tuple[Path, Path]]:
        """(folder, its parent) from `folder` up to the root, for each folder whose entry
        this process has not made durable yet (`_durable_entries`)."""
        fresh = []
        current = folder
        while current != self.root and str(current) not in self._durable:
            fresh.append((current, current.parent))
            current = current.parent
        return fresh

    def _mark_durable(self, folders: Iterable[Path]) -> None:
        for current in folders:
            if len(self._durable) >= DURABLE_FOLDERS_KEPT:
                self._durable.clear()
            self._durable[str(current)] = None

    def stage_sync(self, key: str, data: bytes) -> str:
        """Write `data` to `.{name}.{random}.tmp` beside `key` and fsync it."""
        staged = self._staging_path(key)
        # 0600 from the first byte (not after a chmod): blobs are every tenant's data.
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        try:
            with open(fd, "wb") as f:
                f.write(data)
                if self._fsync:
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            # ENOSPC mid-write, a failed fsync: leave no partial temp file behind.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
            raise
        return str(staged)

    async def stage_checked(
        self, key: str, data: bytes, algorithm: str, expected: str
    ) -> tuple[object | None, str]:
        """Hash `data` and stage it for `key` in one pass on one worker thread (merge_core,
        GIL released): (the staging handle, or None when the digest is not `expected` and
        nothing was kept; the digest)."""
        return await asyncio.to_thread(self.stage_checked_sync, key, data, algorithm, expected)

    def stage_checked_sync(
        self, key: str, data: bytes, algorithm: str, expected: str
    ) -> tuple[str | None, str]:
        """`stage_sync` that also hashes: the temp file is written, hashed and fsynced by
        `merge_core.write_chunk`, which removes it (unsynced) on a digest other than
        `expected` and on any error, so a refused or failed chunk leaves no file."""
        staged = self._staging_path(key)
        try:
            actual = merge_core.write_chunk(staged, data, algorithm, expected, self._fsync)
        except merge_core.MergeIOError as exc:
            raise _os_error(exc) from exc
        return (str(staged) if actual == expected else None), actual

    async def publish(self, staged: object, key: str) -> None:
        """Rename the staged file over `key` and fsync the directory entry."""
        await asyncio.to_thread(self._publish_sync, str(staged), key)

    def _publish_sync(self, staged: str, key: str) -> None:
        self._publish_many_sync([(staged, key)])

    async def publish_many(self, items: Sequence[tuple[object, str]]) -> None:
        """Rename every staged file over its key, then fsync each folder once (on a thread):
        a group commit's chunks of one upload share one directory fsync."""
        await asyncio.to_thread(self._publish_many_sync, [(str(s), k) for s, k in items])

    def _publish_many_sync(self, items: Sequence[tuple[str, str]]) -> None:
        folders: dict[Path, None] = {}
        for staged, key in items:
            final = self.path(key)
            os.replace(staged, final)
            folders[final.parent] = None
        if self._fsync:
            for folder in folders:
                _fsync_dir(folder)
                self._durable_entries(folder)

    async def discard(self, staged: object) -> None:
        """Remove a staged file (missing, e.g. already renamed, is fine)."""
        await asyncio.to_thread(self._discard_sync, str(staged))

    @staticmethod
    def _discard_sync(staged: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)

    async def exists(self, key: str) -> bool:
        """True if a file is stored under `key`."""
        return self.path(key).is_file()

    async def size(self, key: str) -> int:
        """Size of the file under `key`."""
        return self.path(key).stat().st_size

    async def read(self, key: str, offset: int = 0, length: int = -1) -> bytes:
        """Read `length` bytes (all when -1) of `key` from `offset`."""
        return await asyncio.to_thread(self._read_sync, key, offset, length)

    def _read_sync(self, key: str, offset: int, length: int) -> bytes:
        with open(self.path(key), "rb") as f:
            f.seek(offset)
            return f.read(length)

    async def iter_read(self, key: str, offset: int, block: int) -> AsyncIterator[bytes]:
        """Yield `key`'s bytes from `offset` in blocks of `block` (each read on a thread)."""
        f = await asyncio.to_thread(open, self.path(key), "rb")
        try:
            f.seek(offset)
            while data := await asyncio.to_thread(f.read, block):
                yield data
        finally:
            f.close()

    async def copy(self, source: str, key: str) -> None:
        """Copy `source` to a temp file beside `key`, fsync it and rename it over `key`
        (on a thread). Once open, `source` is copied whole even if it is unlinked meanwhile
        (the retention sweep): an open file outlives its name."""
        await asyncio.to_thread(self._copy_sync, source, key)

    def _copy_sync(self, source: str, key: str) -> None:
        with open(self.path(source), "rb") as src:
            staged = self._staging_path(key)
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                with open(fd, "wb") as dst:
                    shutil.copyfileobj(src, dst, COPY_BLOCK)
                    if self._fsync:
                        dst.flush()
                        os.fsync(dst.fileno())
                self._publish_sync(str(staged), key)
            except BaseException:
                # A full disk, a failed fsync or rename: no partial temp file stays.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(staged)
                raise

    async def delete(self, key: str) -> None:
        """Remove the file under `key` (missing is fine)."""
        await asyncio.to_thread(self.path(key).unlink, missing_ok=True)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete the folder behind `prefix`; returns the number of files removed."""
        return await asyncio.to_thread(self._delete_prefix_sync, prefix)

    def _delete_prefix_sync(self, prefix: str) -> int:
        """Remove the folder's files and then its folders, deepest first, counting the files
        this call removed. Another sweep (a replica's, the admin tool's) may be removing the
        same folder meanwhile: what it removed first is neither counted nor an error (a walk
        of a folder that is gone yields nothing; errors stay ignored, as rmtree's were)."""
        folder = self.path(prefix)
        removed = 0
        for parent, _, files in os.walk(folder, topdown=False):
            for name in files:
                try:
                    os.unlink(os.path.join(parent, name))
                except OSError:
                    continue
                removed += 1
            with contextlib.suppress(OSError):
                os.rmdir(parent)
        # Forgotten once gone (not before: a write meanwhile would mark it again), so a
        # folder made again later is fsynced in its parent again (one level: the keys'
        # folders hold files only).
        self._durable.pop(str(folder), None)
        return removed

    async def list_objects(self, prefix: str) -> AsyncIterator[StoredObject]:
        """Every file under `prefix/` (walked on a thread), temp files marked temporary."""
        for item in await asyncio.to_thread(self._list_sync, prefix):
            yield item

    def _list_sync(self, prefix: str) -> list[StoredObject]:
        found: list[StoredObject] = []
        # A folder or file deleted while we walk (another job's sweep) is skipped: os.walk
        # ignores a folder it can no longer read, and a file gone before its stat is passed.
        for parent, _, files in os.walk(self.path(prefix)):
            for name in files:
                path = os.path.join(parent, name)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                temporary = name.startswith(".") and (
                    name.endswith(".tmp") or name.endswith(MERGE_TMP_SUFFIX)
                )
                found.append(
                    StoredObject(
                        Path(os.path.relpath(path, self.root)).as_posix(),
                        st.st_size,
                        datetime.fromtimestamp(st.st_mtime, UTC),
                        temporary,
                    )
                )
        return found

    def _remove_predecessors_sync(self, output: Path) -> int:
        """Delete earlier merges' temp files of this output (a killed merge's litter).

        The output key is per upload and one merge job runs per upload at a time, so a temp
        file of the same output belongs to an attempt that died (SIGKILL leaves it), or to
        a stalled duplicate whose lease lapsed: unlinking it makes that one's rename fail
        (a retried I/O error), never corrupts the output.
        """
        removed = 0
        for p in output.parent.glob(f".{output.name}.*{MERGE_TMP_SUFFIX}"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed += 1
        return removed

    async def merge(
        self,
        chunks: Sequence[ChunkRef],
        key: str,
        algorithm: str,
        expected_checksum: str | None,
    ) -> Merged:
        """merge_core's file merge: chunk files to a temp file, verified, renamed to `key`."""
        files = [merge_core.Chunk(c.index, self.path(c.key), c.size, c.checksum) for c in chunks]
        output = self.path(key)
        private_dirs(output.parent)
        await asyncio.to_thread(self._remove_predecessors_sync, output)
        # merge_core releases the GIL; a thread keeps the event loop (heartbeats) going.
        result = await asyncio.to_thread(
            merge_core.merge, files, output, algorithm, expected_checksum, self._fsync
        )
        # merge_core creates its output under the umask; the 0700 folder already keeps
        # others out, this makes the file itself 0600 too.
        os.chmod(output, FILE_MODE)
        if self._fsync:  # merge_core fsynced the output's folder
            await asyncio.to_thread(self._durable_entries, output.parent)
        return Merged(key, result.size, result.checksum, result.algorithm, result.chunk_count)

    async def abort_unfinished(self, before: datetime) -> int:
        """Nothing: a killed merge's temp file is an object `list_objects` shows."""
        return 0

    async def checksum(self, key: str, algorithm: str) -> str:
        """merge_core's checksum of the file (GIL released, on a thread)."""
        return await asyncio.to_thread(merge_core.checksum_file, self.path(key), algorithm)

    async def close(self) -> None:
        """Nothing to release."""
