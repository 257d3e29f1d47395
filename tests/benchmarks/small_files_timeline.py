"""A timeline of one small file's commit, in process: when each statement is sent and
answered, each wait of psycopg's for the server, the blob write, the COMMIT; the median over
the files of the most common shape. `profile_small_files.py --timeline` prints it (one
file at a time; the statements and waits on PostgreSQL). A profile aid: the wrappers cost
a little time of their own.
"""

from __future__ import annotations

import collections
import statistics
import time
from typing import Any


class Timeline:
    """Marks of every file's commit (`install` before the files run, `report` after)."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._marks: list[tuple[str, float]] = []
        self._files: list[list[tuple[str, float]]] = []

    def _mark(self, name: str) -> None:
        if self._started is not None:
            self._marks.append((name, time.perf_counter() - self._started))

    def install(self) -> None:
        """Wrap psycopg's statements, waits and commits, the local store's put and
        `UploadFiles.upload` (one file's start and end)."""
        import psycopg
        import psycopg.waiting

        from services.upload.merge import upload_file
        from services.upload.storage.blob_store import local

        def timed(owner: Any, name: str, label: Any) -> None:
            original = getattr(owner, name)

            async def wrapped(*args: Any, **kwargs: Any) -> Any:
                what = label(args)
                self._mark(f"> {what}")
                try:
                    return await original(*args, **kwargs)
                finally:
                    self._mark(f"< {what}")

            setattr(owner, name, wrapped)

        def statement(args: Any) -> str:
            return " ".join(str(args[1]).split())[:48]

        timed(psycopg.AsyncCursor, "execute", statement)
        timed(psycopg.AsyncCursor, "executemany", statement)
        timed(psycopg.AsyncConnection, "commit", lambda args: "COMMIT")
        timed(psycopg.waiting, "wait_async", lambda args: "  (psycopg waits on its socket)")
        timed(local.LocalBlobStore, "put", lambda args: "blob put")
        upload = upload_file.UploadFiles.upload

        async def one_file(*args: Any, **kwargs: Any) -> Any:
            self._started, self._marks = time.perf_counter(), []
            try:
                return await upload(*args, **kwargs)
            finally:
                self._mark("committed")
                self._files.append(self._marks)
                self._started = None

        upload_file.UploadFiles.upload = one_file  # type: ignore[method-assign]

    def report(self, last: int) -> list[str]:
        """The median timeline of the commonest shape among the `last` files."""
        files = self._files[-last:]
        shapes = collections.Counter(tuple(name for name, _ in marks) for marks in files)
        shape = shapes.most_common(1)[0][0]
        alike = [marks for marks in files if tuple(name for name, _ in marks) == shape]
        lines = [f"timeline of one file, median of {len(alike)} of the last {len(files)}:"]
        for i, name in enumerate(shape):
            at = statistics.median(marks[i][1] for marks in alike)
            lines.append(f"{at * 1000:8.2f} ms  {name}")
        return lines
