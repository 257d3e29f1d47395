"""Helpers for the Prometheus tests: the rule and dashboard files, metric names they use,
and a real Prometheus server on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO_ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERT_TESTS = PROMETHEUS_DIR / "tests" / "alerts_test.yml"
GRAFANA_DIR = REPO_ROOT / "deploy" / "grafana" / "dashboards"
READY_TIMEOUT_S = 30.0

# A metric name in PromQL: serentak_* or the scrape's own `up`.
_METRIC = re.compile(r"\b(serentak_[a-z0-9_]+|up)\b")
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def require(binary: str) -> str:
    """The path of `binary`; fails in CI (which installs it), skips elsewhere."""
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{binary} is required in CI (.ci/run installs the prometheus package)")
        pytest.skip(f"{binary} not installed (apt-get install prometheus)")
    return path


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of deploy/prometheus/alerts.yml."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard_exprs() -> dict[str, list[str]]:
    """PromQL of every panel target, per dashboard file."""
    exprs: dict[str, list[str]] = {}
    for path in sorted(GRAFANA_DIR.glob("*.json")):
        board = json.loads(path.read_text())
        exprs[path.name] = [
            target["expr"] for panel in board["panels"] for target in panel.get("targets", [])
        ]
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (label values and functions excluded)."""
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_strings = re.sub(r'"[^"]*"', "", without_labels)
    return set(_METRIC.findall(without_strings))


def family(name: str) -> str:
    """`x_bucket` / `x_count` / `x_sum` -> `x` (the histogram a series belongs to)."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def get_json(url: str) -> Any:
    """GET `url` and decode its JSON `data`."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]


def exported_families(target: str) -> set[str]:
    """Metric families a /metrics endpoint announces with `# TYPE name kind`."""
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as response:
        text = response.read().decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))


def wait_for(check: Any, what: str, timeout: float = READY_TIMEOUT_S) -> Any:
    """Poll `check()` until it returns something truthy (Prometheus has no push to wait on)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:  # not listening yet
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@contextlib.contextmanager
def prometheus_server(
    tmp_path: Path, targets: dict[str, str], rule_files: list[Path]
) -> Iterator[str]:
    """Run the real Prometheus scraping `targets` (job -> host:port) every second."""
    binary = require("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ],
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for(
                lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200,
                "prometheus ready",
            )
        except AssertionError as exc:
            raise AssertionError(log_path.read_text(errors="replace")[-3000:]) from exc
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
