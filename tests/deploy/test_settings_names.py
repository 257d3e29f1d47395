"""Every SERENTAK_* variable the compose file and the Kubernetes manifests set names a real
setting (settings ignore unknown variables, so a typo would pass silently in production)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic_settings import BaseSettings

from services.common.config import CommonSettings
from services.common.health_probe import ProbeSettings
from services.locks.settings import LocksSettings
from services.notify.settings import NotifySettings
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
FILES = [
    REPO_ROOT / "deploy" / "compose" / "compose.yaml",
    *sorted((REPO_ROOT / "deploy" / "k8s").rglob("*.yaml")),
]
# Read by compose itself, not by a service.
COMPOSE_ONLY = {"SERENTAK_IMAGE"}


def _env_names(cls: type[BaseSettings]) -> set[str]:
    prefix = cls.model_config.get("env_prefix", "")
    return {f"{prefix}{field}".upper() for field in cls.model_fields}


def test_every_variable_set_is_a_setting() -> None:
    known = set().union(
        *(
            _env_names(cls)
            for cls in (
                CommonSettings,
                UploadSettings,
                LocksSettings,
                NotifySettings,
                SyncSettings,
                ProbeSettings,
            )
        )
    )
    used: dict[str, set[str]] = {}
    for path in FILES:
        for name in re.findall(r"\b(SERENTAK_[A-Z0-9_]+)\b", path.read_text()):
            used.setdefault(name, set()).add(str(path.relative_to(REPO_ROOT)))
    assert len(used) > 20
    unknown = {n: sorted(w) for n, w in used.items() if n not in known | COMPOSE_ONLY}
    assert unknown == {}, unknown
