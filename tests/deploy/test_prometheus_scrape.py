"""The real Prometheus scraping a running stack (locks, notify, upload as processes):
every metric a rule or a dashboard panel reads exists in the scrape (no dead queries), and
alerts fire when their faults are caused for real: a merge refused on a corrupt chunk, and
a sync job dead-lettered because the upstream provider refuses our credentials."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import grpc
import pytest
from serentak.upload.v1 import sync_pb2, sync_pb2_grpc, upload_pb2_grpc
from support.prometheus import (
    ALERTS,
    alert_rules,
    dashboard_exprs,
    exported_families,
    family,
    get_json,
    metric_names,
    prometheus_server,
    wait_for,
)
from support.services import ServiceProcess, service_process
from upload.upload_helpers import chunk_request, create_request, split

from services.upload.settings import UploadSettings

FAULT_ALERT = "SerentakMergeFailedMissingOrCorrupt"
DEAD_LETTER_ALERTS = ("SerentakDeadLettersGrowing", "SerentakSyncAuthFailures")
CHUNK = 1024
MD = (("authorization", "Bearer dev-alice"),)


class _Refusing(BaseHTTPRequestHandler):
    """An upstream provider that answers 401 to everything (expired credentials)."""

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_provider() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


@pytest.fixture
def stack(tmp_path: Path, etcd, refusing_provider: str) -> Iterator[dict[str, ServiceProcess]]:
    """locks, notify and upload as `python -m` processes on SQLite, metrics on."""
    env = {
        "SERENTAK_SYNC_PROVIDER_BASE_URL": refusing_provider,
        "SERENTAK_SYNC_PROVIDER_TOKENS": '{"acme": "expired-token"}',
        "SERENTAK_ETCD_ENDPOINT": etcd.endpoint,
        "SERENTAK_METRICS_SAMPLE_SECONDS": "1",
        "SERENTAK_MIN_CHUNK_SIZE": str(CHUNK),
    }
    with service_process("locks", tmp_path, env) as locks:
        env["SERENTAK_LOCKS_ADDRESS"] = locks.address
        with service_process("notify", tmp_path, env) as notify:
            env["SERENTAK_NOTIFY_ADDRESS"] = notify.address
            with service_process("upload", tmp_path, env) as upload:
                yield {"locks": locks, "notify": notify, "upload": upload}


def _used_metrics() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for rule in alert_rules():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"alert {rule['alert']}")
    for board, exprs in dashboard_exprs().items():
        for expr in exprs:
            for name in metric_names(expr):
                used.setdefault(name, set()).add(f"dashboard {board}")
    return used


def _targets_up(url: str) -> int:
    targets = get_json(f"{url}/api/v1/targets")["activeTargets"]
    return sum(1 for t in targets if t["health"] == "up")


def _firing(url: str, name: str) -> list[dict]:
    alerts = get_json(f"{url}/api/v1/alerts")["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def _link_item(stack: dict[str, ServiceProcess]) -> None:
    """Link an upstream item: its first sync meets a 401 and is dead-lettered."""
    with grpc.insecure_channel(stack["upload"].address) as channel:
        sync_pb2_grpc.SyncServiceStub(channel).LinkItem(
            sync_pb2.LinkItemRequest(
                account_id="acct", upstream_drive_id="drive", upstream_item_id="item"
            ),
            metadata=MD,
            timeout=10,
        )


def _corrupt_merge(stack: dict[str, ServiceProcess], tmp_path: Path) -> None:
    """Upload three chunks, flipping a byte of the second on disk before the last arrives."""
    md = MD
    data = os.urandom(CHUNK * 3)
    chunks = split(data, CHUNK)
    blob_root = UploadSettings(data_dir=tmp_path / "data").blob_root
    with grpc.insecure_channel(stack["upload"].address) as channel:
        uploads = upload_pb2_grpc.UploadServiceStub(channel)
        upload = uploads.CreateUpload(create_request(data, CHUNK), metadata=md, timeout=10)
        for i in (0, 1):
            uploads.PutChunk(chunk_request(upload.upload_id, i, chunks[i]), metadata=md, timeout=10)
        stored = blob_root / "uploads" / upload.upload_id / "1"
        stored.write_bytes(bytes([chunks[1][0] ^ 0xFF]) + chunks[1][1:])
        uploads.PutChunk(chunk_request(upload.upload_id, 2, chunks[2]), metadata=md, timeout=10)


def test_rules_and_dashboards_read_live_metrics_and_an_alert_fires(
    stack: dict[str, ServiceProcess], tmp_path: Path
) -> None:
    targets = {f"serentak-{name}": f"127.0.0.1:{svc.metrics_port}" for name, svc in stack.items()}
    with prometheus_server(tmp_path / "prom", targets, [ALERTS]) as url:
        wait_for(lambda: _targets_up(url) == len(targets), "every target scraped")
        # Series Prometheus scraped, and the families the targets announce by # TYPE (a
        # labelled counter nobody has incremented yet has no series, but it is exported).
        series = set(get_json(f"{url}/api/v1/label/__name__/values"))
        families = {name for target in targets.values() for name in exported_families(target)}
        used = _used_metrics()
        assert used, "no metric names found in rules and dashboards"
        dead = {
            name: sorted(where)
            for name, where in used.items()
            if name not in series and family(name) not in families
        }
        assert dead == {}, f"queries read metrics nobody exports: {dead}"

        # Every query parses and evaluates on the live server.
        exprs = [r["expr"] for r in alert_rules()]
        exprs += [e for board in dashboard_exprs().values() for e in board]
        for expr in exprs:
            assert get_json(f"{url}/api/v1/query?query={quote(expr)}")["resultType"], expr

        # Healthy stack: the fault's alert is silent.
        assert _firing(url, FAULT_ALERT) == []
        _corrupt_merge(stack, tmp_path)
        fired = wait_for(lambda: _firing(url, FAULT_ALERT), f"{FAULT_ALERT} firing", 60)
        assert fired[0]["labels"]["reason"] == "checksum"
        assert fired[0]["annotations"]["runbook"]
        query = quote('serentak_upload_merge_failures_total{reason="checksum"}')
        assert get_json(f"{url}/api/v1/query?query={query}")["result"]

        for name in DEAD_LETTER_ALERTS:
            assert _firing(url, name) == []
        _link_item(stack)
        for name in DEAD_LETTER_ALERTS:
            wait_for(lambda name=name: _firing(url, name), f"{name} firing", 60)
        grown = _firing(url, "SerentakDeadLettersGrowing")
        assert [a["labels"]["job_type"] for a in grown] == ["upload.sync.item"]
