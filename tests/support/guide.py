"""Follow an executable guide (docs/deploy-replicated.md) as an operator would: its fenced
shell blocks, in order, marked in their info string.

- ```` ```sh inventory ````: the variables every later block reads; evaluated once with
  the caller's values for some of them (a value set in the environment wins).
- ```` ```sh step ````: run once; must exit 0.
- ```` ```sh run NAME ````: a long-running process, started once per host in `NAME_HOSTS`
  (with `N`, 1-based, and `HOST` set), or once when there is no such list.
- ```` ```sh check ````: run until it exits 0 (bounded).

Every block runs under bash (`-eu -o pipefail`) from the repository root, in an
environment of the inventory alone (plus PATH, HOME and PYTHONPATH): nothing of the test
process's own settings leaks into what the guide starts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from support.process import kill_process, stop_process
from support.services import REPO_ROOT, SUBPROCESS_PYTHONPATH

BLOCK = re.compile(r"^```sh (inventory|step|run|check)(?: (\w+))?\n(.*?)^```", re.M | re.S)
CHECK_TIMEOUT_S = 90.0
STEP_TIMEOUT_S = 120.0


HEADING = re.compile(r"^## (.+)$", re.M)


@dataclass(frozen=True)
class Block:
    """One marked block: its kind, its name (`run` blocks), its text, and the heading of
    the section it is in (for messages)."""

    kind: str
    name: str
    text: str
    section: str = ""

    @property
    def label(self) -> str:
        """`section: kind name`, e.g. `5. etcd: run etcd`."""
        return f"{self.section}: {self.kind}{' ' + self.name if self.name else ''}"


def blocks(path: Path) -> list[Block]:
    """The marked blocks of the Markdown file at `path`, in order."""
    text = path.read_text()
    found = []
    for match in BLOCK.finditer(text):
        headings = HEADING.findall(text, 0, match.start())
        kind, name, body = match.groups()
        found.append(Block(kind, name or "", body, headings[-1] if headings else ""))
    return found


def base_env() -> dict[str, str]:
    """What every block gets besides the inventory: this virtualenv first on PATH (as the
    guide asks), a home, and this checkout's code before any installed copy."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    return {**env, "PYTHONPATH": SUBPROCESS_PYTHONPATH}


@dataclass
class GuideProcess:
    """A process a `run` block started: restartable (same block, same N and HOST)."""

    name: str
    n: int
    host: str
    block: Block
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def kill(self) -> None:
        """SIGKILL, as a crash (the block `exec`s, so the pid is the service's)."""
        if self.process is not None:
            kill_process(self.process)
            self.process = None

    def stop(self) -> None:
        """SIGTERM, as a supervisor stops it; killed if it does not exit in time."""
        if self.process is not None:
            stop_process(self.process, timeout=20)
            self.process = None

    def log_text(self) -> str:
        """Everything it logged, over all its lives."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Guide:
    """The guide's blocks run in a place of the caller's: logs under `log_dir`."""

    path: Path
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, list[GuideProcess]] = field(default_factory=dict)
    # The first check after each run block: how to tell that NAME's processes are ready.
    checks: dict[str, Block] = field(default_factory=dict)
    # Seconds each block took, in order, by label, for the report.
    timings: list[tuple[str, float]] = field(default_factory=list)

    def inventory(self, block: Block, values: dict[str, str]) -> None:
        """Evaluate the inventory with `values` set beforehand; keep what it defines."""
        names = re.findall(r"^([A-Z][A-Z0-9_]*)=", block.text, re.M)
        unknown = set(values) - set(names)
        assert not unknown, f"not in the guide's inventory: {sorted(unknown)}"
        script = f"{block.text}\nenv -0"
        done = self._bash(script, {**base_env(), **values}, STEP_TIMEOUT_S)
        assert done.returncode == 0, done.stdout
        out = dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
        self.env = {**base_env(), **{n: out[n] for n in names}}

    def step(self, block: Block) -> str:
        """Run a step once; its output (raises with it on failure)."""
        done = self._bash(block.text, self.env, STEP_TIMEOUT_S)
        if done.returncode != 0:
            raise AssertionError(
                f"{block.label} failed ({done.returncode}):\n{block.text}{done.stdout}"
            )
        return done.stdout

    def check(self, block: Block, timeout: float = CHECK_TIMEOUT_S) -> str:
        """Run a check until it exits 0; its last output (raises after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            done = self._bash(block.text, self.env, timeout)
            if done.returncode == 0:
                return done.stdout
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{block.label} never passed:\n{block.text}{done.stdout}\n{self.log_tails()}"
                )
            time.sleep(0.5)  # polling an observable condition (the check), bounded

    def hosts(self, name: str) -> list[str]:
        """The hosts of `run NAME` (`NAME_HOSTS`), or one unnamed host."""
        listed = self.env.get(f"{name.upper()}_HOSTS")
        return listed.split() if listed else [""]

    def start(self, block: Block) -> list[GuideProcess]:
        """Start the block's process on each of its hosts (not waiting for readiness)."""
        started = []
        for n, host in enumerate(self.hosts(block.name), start=1):
            proc = GuideProcess(block.name, n, host, block, self.log_dir / f"{block.name}-{n}.log")
            self.restart(proc)
            started.append(proc)
        self.processes[block.name] = started
        return started

    def restart(self, proc: GuideProcess) -> None:
        """(Re)start `proc` from its block, its output appended to its log."""
        env = {**self.env, "N": str(proc.n), "HOST": proc.host}
        with open(proc.log_path, "ab") as log:
            proc.process = subprocess.Popen(
                ["bash", "-eu", "-o", "pipefail", "-c", proc.block.text],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def follow(self, values: dict[str, str]) -> None:
        """Every marked block in order: the whole deployment up, each check passed."""
        pending_runs: list[str] = []
        for block in blocks(self.path):
            started = time.monotonic()
            if block.kind == "inventory":
                self.inventory(block, values)
            elif block.kind == "step":
                self.step(block)
            elif block.kind == "run":
                self.start(block)
                pending_runs.append(block.name)
            else:
                for name in pending_runs:
                    self.checks.setdefault(name, block)
                pending_runs.clear()
                self.check(block)
            self.timings.append((block.label, time.monotonic() - started))

    def all_processes(self) -> Iterator[GuideProcess]:
        """Every process any run block started."""
        for procs in self.processes.values():
            yield from procs

    def stop_all(self) -> None:
        """Stop every process, services first, etcd and the JWKS last."""
        last = {"etcd", "jwks"}
        for proc in [p for p in self.all_processes() if p.name not in last]:
            proc.stop()
        for proc in [p for p in self.all_processes() if p.name in last]:
            proc.stop()

    def read_env_file(self, relative: str) -> dict[str, str]:
        """A settings file the guide rendered (`etc/upload-1.env`), as the shell reads it."""
        path = Path(self.env["DIR"]) / relative
        names = re.findall(r"^([A-Z][A-Z0-9_]*)=", path.read_text(), re.M)
        done = self._bash(f'set -a; . "{path}"; env -0', self.env, STEP_TIMEOUT_S)
        assert done.returncode == 0, done.stdout
        values = dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
        return {name: values[name] for name in names}

    def log_tails(self, chars: int = 1500) -> str:
        """The end of each process's log (for a failure's message)."""
        return "\n".join(
            f"--- {p.name}-{p.n} ({'up' if p.process and p.process.poll() is None else 'down'})"
            f"\n{p.log_text()[-chars:]}"
            for p in self.all_processes()
        )

    @staticmethod
    def _bash(script: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        command = ["bash", "-eu", "-o", "pipefail", "-c", script]
        try:
            return subprocess.run(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
            return subprocess.CompletedProcess(command, -9, f"{out}(timed out after {timeout} s)")
