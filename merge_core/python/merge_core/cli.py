"""Command line for media pipelines: merge the chunks a manifest lists.

Usage::

    python -m merge_core MANIFEST OUTPUT [--algorithm sha256|blake3|crc32c]
                         [--expected-checksum HEX] [--no-fsync] [--no-progress]
                         [--mmap]

MANIFEST is a JSON file (``-`` for stdin): either a list of chunks, or an
object ``{"chunks": [...], "algorithm": ..., "expected_checksum": ...}``
whose optional keys are defaults that command-line flags override. Each chunk
is ``{"index": int, "path": str, "size": int, "checksum": hex}``; a relative
``path`` is relative to the manifest's directory (the working directory for
stdin). Order comes from ``index`` alone.

On success the result is printed to stdout as one JSON object (``output_path``,
``size``, ``checksum``, ``algorithm``, ``chunk_count``, ``duration_seconds``).
On failure one JSON object ``{"error": KIND, "message": ..., "index": ...}``
(plus ``expected``/``actual``/``path``/``errno`` where they apply) is printed to
stdout, and the message to stderr. A progress bar is drawn on stderr only when
stderr is a terminal.

Exit codes:

* 0 -- merged; the output is in place.
* 2 -- bad input: usage, unreadable or invalid manifest, missing or duplicate
  index, unknown algorithm, malformed checksum.
* 3 -- corrupt data: a chunk's checksum or size is wrong, or the whole file's
  checksum is not ``--expected-checksum``.
* 4 -- I/O error (a chunk file cannot be read, the output cannot be written).
* 130 -- interrupted (Ctrl-C). In every failing case nothing is left at OUTPUT.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import merge_core
from merge_core import Chunk

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_CORRUPT = 3
EXIT_IO = 4
EXIT_INTERRUPTED = 130

_EXIT_BY_ERROR: tuple[tuple[type[BaseException], int], ...] = (
    (merge_core.MissingChunk, EXIT_BAD_INPUT),
    (merge_core.DuplicateChunk, EXIT_BAD_INPUT),
    (merge_core.ChunkChecksumMismatch, EXIT_CORRUPT),
    (merge_core.ChunkSizeMismatch, EXIT_CORRUPT),
    (merge_core.FileChecksumMismatch, EXIT_CORRUPT),
    (merge_core.MergeIOError, EXIT_IO),
)


class BadInput(Exception):
    """The manifest or the arguments are unusable (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _fail(EXIT_BAD_INPUT, {"error": "usage", "message": message, "index": None})


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m merge_core",
        description="Merge chunk files in index order, verifying every checksum.",
    )
    parser.add_argument("manifest", help="JSON manifest of chunks, or - for stdin")
    parser.add_argument("output", help="path of the merged file")
    parser.add_argument("--algorithm", choices=merge_core.ALGORITHMS, default=None)
    parser.add_argument("--expected-checksum", default=None, help="whole-file checksum (hex)")
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync (not durable)")
    parser.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    parser.add_argument(
        "--mmap",
        action="store_true",
        help="map chunk files instead of read()ing them into private buffers "
        "(only for chunk files nothing changes or truncates during the merge: "
        "a truncated file or a disk error on a mapped page kills the process)",
    )
    # Reading became the default (it was mapping); the old flag is still accepted.
    parser.add_argument("--no-mmap", action="store_true", help=argparse.SUPPRESS)
    return parser


def load_manifest(source: str) -> tuple[list[Chunk], dict[str, Any]]:
    """Reads a manifest; returns its chunks and its optional settings."""
    try:
        if source == "-":
            document = json.load(sys.stdin)
            base = os.getcwd()
        else:
            with open(source, encoding="utf-8") as f:
                document = json.load(f)
            base = os.path.dirname(os.path.abspath(source))
    except OSError as e:
        raise BadInput(f"cannot read manifest {source}: {e.strerror or e}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInput(f"manifest {source} is not valid JSON: {e}") from e

    settings: dict[str, Any] = {}
    if isinstance(document, dict):
        entries = document.get("chunks")
        for key in ("algorithm", "expected_checksum"):
            value = document.get(key)
            if value is not None and not isinstance(value, str):
                raise BadInput(f"manifest {key} must be a string")
            settings[key] = value
    else:
        entries = document
    if not isinstance(entries, list):
        raise BadInput("manifest must be a list of chunks or an object with a 'chunks' list")
    return [_chunk(entry, position, base) for position, entry in enumerate(entries)], settings


def _chunk(entry: object, position: int, base: str) -> Chunk:
    if not isinstance(entry, dict):
        raise BadInput(f"manifest chunk #{position} is not an object")
    fields: dict[str, Any] = {}
    for key, kind in (("index", int), ("path", str), ("size", int), ("checksum", str)):
        value: Any = entry.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BadInput(f"manifest chunk #{position}: '{key}' must be {kind.__name__}")
        if isinstance(value, int) and value < 0:
            raise BadInput(f"manifest chunk #{position}: '{key}' must not be negative")
        fields[key] = value
    fields["path"] = os.path.join(base, fields["path"])
    return Chunk(**fields)


@contextmanager
def _progress_reporter(enabled: bool) -> Iterator[Callable[[int, int], None]]:
    """Yields a progress callback; draws a rich bar on stderr if enabled.

    The callback is passed even without a bar: while merge_core calls it, it
    also checks for signals, so Ctrl-C stops the merge promptly.
    """
    if not enabled:
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("merge", total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield report


def _error_report(err: BaseException) -> dict[str, Any]:
    report: dict[str, Any] = {
        "error": type(err).__name__,
        "message": str(err),
        "index": getattr(err, "index", None),
    }
    for attr in ("expected", "actual", "path", "errno", "operation"):
        if hasattr(err, attr):
            report[attr] = getattr(err, attr)
    return report


def _fail(code: int, report: dict[str, Any]) -> NoReturn:
    print(json.dumps(report), flush=True)
    print(f"merge_core: {report['message']}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        chunks, settings = load_manifest(args.manifest)
        algorithm = args.algorithm or settings.get("algorithm") or "sha256"
        if algorithm not in merge_core.ALGORITHMS:
            raise BadInput(f"unknown algorithm {algorithm!r}")
        expected = args.expected_checksum or settings.get("expected_checksum")
        show_bar = not args.no_progress and sys.stderr.isatty()
        with _progress_reporter(show_bar) as progress:
            result = merge_core.merge(
                chunks,
                args.output,
                algorithm=algorithm,
                expected_checksum=expected,
                fsync=not args.no_fsync,
                progress=progress,
                mmap=args.mmap and not args.no_mmap,
            )
    except BadInput as e:
        _fail(EXIT_BAD_INPUT, {"error": "bad_input", "message": str(e), "index": None})
    except ValueError as e:  # from merge_core: malformed checksum hex
        _fail(EXIT_BAD_INPUT, {"error": "bad_input", "message": str(e), "index": None})
    except merge_core.MergeError as e:
        code = next((c for kind, c in _EXIT_BY_ERROR if isinstance(e, kind)), EXIT_IO)
        _fail(code, _error_report(e))
    except KeyboardInterrupt:
        _fail(EXIT_INTERRUPTED, {"error": "interrupted", "message": "interrupted", "index": None})
    print(json.dumps(result.to_dict()), flush=True)
    return EXIT_OK
