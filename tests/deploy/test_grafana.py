"""deploy/grafana: the five dashboards the README lists, each panel querying the
provisioned Prometheus datasource (their metric names are checked against a live scrape in
test_prometheus_scrape.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from support.prometheus import GRAFANA_DIR, dashboard_exprs

PROVISIONING = GRAFANA_DIR.parent / "provisioning"


def test_the_five_dashboards_exist_with_unique_uids() -> None:
    boards = {p.name: json.loads(p.read_text()) for p in GRAFANA_DIR.glob("*.json")}
    assert sorted(boards) == [
        "serentak-locks.json",
        "serentak-notify.json",
        "serentak-queue.json",
        "serentak-sync.json",
        "serentak-upload.json",
    ]
    assert len({b["uid"] for b in boards.values()}) == len(boards)


def test_every_panel_queries_the_provisioned_datasource() -> None:
    (source,) = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    for path in GRAFANA_DIR.glob("*.json"):
        board = json.loads(path.read_text())
        assert board["panels"], path.name
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == source["uid"], (path.name, panel["title"])
            assert panel["targets"], (path.name, panel["title"])
            refs = [t["refId"] for t in panel["targets"]]
            assert len(set(refs)) == len(refs)
    assert all(exprs for exprs in dashboard_exprs().values())


def test_dashboard_provider_points_where_compose_mounts_them() -> None:
    (provider,) = yaml.safe_load((PROVISIONING / "dashboards" / "serentak.yml").read_text())[
        "providers"
    ]
    compose = (Path(GRAFANA_DIR).parents[1] / "compose" / "compose.yaml").read_text()
    assert f"../grafana/dashboards:{provider['options']['path']}:ro" in compose
