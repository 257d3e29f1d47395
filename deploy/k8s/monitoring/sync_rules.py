"""Write prometheusrule.yaml from deploy/prometheus/alerts.yml (one source of truth).

python -m deploy.k8s.monitoring.sync_rules
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE.parents[1] / "prometheus" / "alerts.yml"
TARGET = HERE / "prometheusrule.yaml"
HEADER = "# Generated from deploy/prometheus/alerts.yml by sync_rules.py: edit that file.\n"


def prometheus_rule() -> dict[str, Any]:
    """The PrometheusRule carrying alerts.yml's groups unchanged."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "serentak", "labels": {"app.kubernetes.io/part-of": "serentak"}},
        "spec": {"groups": groups},
    }


def main() -> None:
    """Regenerate TARGET."""
    TARGET.write_text(HEADER + yaml.safe_dump(prometheus_rule(), sort_keys=False, width=100))


if __name__ == "__main__":
    main()
