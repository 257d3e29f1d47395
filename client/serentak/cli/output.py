"""How the CLI speaks: exit codes, one-line errors, `--json` documents, progress on stderr."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from serentak.sdk.named import Named

# Exit codes (also in `serentak --help` and the README).
EXIT_OK = 0
EXIT_FAILED = 1  # the operation ran and failed (a merge failed, an audit found problems)
EXIT_USAGE = 2  # bad arguments or input (argparse, INVALID_ARGUMENT, a missing local file)
EXIT_NOT_FOUND = 3  # NOT_FOUND
EXIT_DENIED = 4  # PERMISSION_DENIED, UNAUTHENTICATED
EXIT_CONFLICT = 5  # ALREADY_EXISTS, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE
EXIT_UNAVAILABLE = 6  # UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (retry later)
EXIT_CORRUPT = 7  # DATA_LOSS, a checksum that does not match
EXIT_INTERRUPTED = 130  # Ctrl-C (not for watch, which Ctrl-C ends: 0)
EXIT_BROKEN_PIPE = 141  # stdout closed early (`| head`): 128 + SIGPIPE, as a shell shows it

EXIT_CODES_HELP = """exit codes:
  0 ok                      1 failed (e.g. merge failed, audit unhealthy)
  2 usage / bad input       3 not found
  4 permission denied or unauthenticated
  5 conflict or precondition (exists, name taken, version changed)
  6 unavailable, timed out or over a limit (retry later)
  7 data corruption (checksum mismatch)
  130 interrupted (Ctrl-C; the message says how to resume; watch: 0)
  141 stdout closed before all was written (e.g. | head), quietly"""

_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: EXIT_USAGE,
    grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED: EXIT_DENIED,
    grpc.StatusCode.UNAUTHENTICATED: EXIT_DENIED,
    grpc.StatusCode.ALREADY_EXISTS: EXIT_CONFLICT,
    grpc.StatusCode.FAILED_PRECONDITION: EXIT_CONFLICT,
    grpc.StatusCode.ABORTED: EXIT_CONFLICT,
    grpc.StatusCode.OUT_OF_RANGE: EXIT_CONFLICT,
    grpc.StatusCode.UNAVAILABLE: EXIT_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: EXIT_UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: EXIT_UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS: EXIT_CORRUPT,
}


def exit_code_for(code: grpc.StatusCode) -> int:
    """The exit code of a failed call's status."""
    return _BY_CODE.get(code, EXIT_FAILED)


class CliError(Exception):
    """A user-facing failure: one line on stderr (and in the --json document), an exit code."""

    def __init__(
        self, message: str, exit_code: int = EXIT_FAILED, *, reason: str = "", hint: str = ""
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.reason = reason
        self.hint = hint


def message_dict(message: Message | Named[Any]) -> dict[str, Any]:
    """A protobuf message (or an SDK result) as a JSON-ready dict (proto field names)."""
    raw = message.message if isinstance(message, Named) else message
    return MessageToDict(raw, preserving_proto_field_name=True)


@dataclass
class Output:
    """Where a command writes: human lines, or one JSON document at the end."""

    json_mode: bool
    document: dict[str, Any] = field(default_factory=dict)
    # A streaming command (watch) printed JSON Lines instead of one document.
    streamed: bool = False

    def line(self, text: str) -> None:
        """A result line on stdout (human mode only)."""
        if not self.json_mode:
            print(text, flush=True)

    def note(self, text: str) -> None:
        """Information for the person at the terminal: always stderr."""
        print(text, file=sys.stderr, flush=True)

    def stream(self, record: dict[str, Any]) -> None:
        """One JSON object on one line of stdout, now (json mode: JSON Lines)."""
        self.streamed = True
        print(json.dumps(record, sort_keys=True), flush=True)

    def emit(self) -> None:
        """Print the JSON document (json mode); after a stream, only an error, on one line."""
        if not self.json_mode:
            return
        if not self.streamed:
            print(json.dumps(self.document, indent=2, sort_keys=True), flush=True)
        elif self.document:
            print(json.dumps(self.document, sort_keys=True), flush=True)


def binary_size(n: float) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 8.0 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ProgressLine:
    """Transfer progress on stderr: percentage, bytes in binary units, rate and ETA.

    On a terminal the line is redrawn in place (at most 10 times a second); otherwise a
    line is written at most once a second and once at the end, so logs stay short.
    """

    def __init__(self, label: str, enabled: bool = True) -> None:
        self._label = label
        self._enabled = enabled
        self._tty = sys.stderr.isatty()
        self._start = time.monotonic()
        self._first_done: int | None = None
        self._last_draw = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if self._first_done is None:
            self._first_done = done  # resumed bytes do not count toward the rate
        final = done >= total
        if not final and now - self._last_draw < (0.1 if self._tty else 1.0):
            return
        self._last_draw = now
        elapsed = max(now - self._start, 1e-6)
        rate = (done - self._first_done) / elapsed
        pct = 100.0 * done / total if total else 100.0
        eta = _clock((total - done) / rate) if rate > 0 and not final else "-:--:--"
        text = (
            f"{self._label}  {pct:5.1f}%  {binary_size(done)} / {binary_size(total)}  "
            f"{binary_size(rate)}/s  ETA {eta}"
        )
        if self._tty:
            sys.stderr.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self._drawn = not final

    def close(self) -> None:
        """End an in-place line that was left unfinished (an error or Ctrl-C)."""
        if self._drawn and self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self._drawn = False
