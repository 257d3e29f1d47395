"""One way to run a test server as a child process: start it with its output in a log
file, wait until it is ready (an observable condition, bounded), stop or kill it.

`LocalServer` is a single restartable process (etcd member, s3s-fs); `spawn`,
`wait_ready`, `stop_process` and `kill_process` serve callers that hold several.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
# What asyncio writes to stderr when a task or coroutine is dropped unfinished or unread:
# never in a service's log (each one is a bug).
ASYNCIO_WARNINGS = (
    "Task was destroyed but it is pending",
    "Task exception was never retrieved",
    "was never awaited",
)


def spawn(command: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `command` with stdout and stderr appended to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)


def wait_ready(
    process: subprocess.Popen[bytes] | None,
    ready: Callable[[], bool],
    exited: str,
    not_ready: str,
    log_path: Path,
    timeout: float = START_TIMEOUT_S,
) -> None:
    """Return once `ready()`; raise RuntimeError(`exited` and the log's tail) if the
    process exits first, or RuntimeError(`not_ready`) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{exited}: {log_path.read_text()[-2000:]}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(not_ready)
        time.sleep(0.05)  # polling an observable condition, bounded by the deadline


def stop_process(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop gracefully (SIGTERM), killing it if it does not exit within `timeout`."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def kill_process(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, as a crash, and reap it."""
    process.kill()
    process.wait()


class LocalServer:
    """One restartable server process: `stop()` then `start()` keeps its data and port.

    Subclasses say what to run (`command`), when it is up (`ready`) and what to call it
    in errors (`name`)."""

    name = "server"
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The argv that starts the server."""
        raise NotImplementedError

    def ready(self) -> bool:
        """True once the server answers."""
        raise NotImplementedError

    def start(self) -> None:
        """Start (or restart) and return once `ready()`; stops it again if it never is."""
        self.process = spawn(self.command(), self.log_path)
        try:
            wait_ready(
                self.process,
                self.ready,
                f"{self.name} exited",
                f"{self.name} did not become ready: {self.log_path}",
                self.log_path,
            )
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop gracefully (SIGTERM), killing it if it does not exit."""
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.process is not None:
            kill_process(self.process)
            self.process = None
