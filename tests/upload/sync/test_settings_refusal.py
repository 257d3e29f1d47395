"""Issue 11 item 11: the published default clientState is refused outside dev auth mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.upload.app import build_app
from services.upload.settings import UploadSettings
from services.upload.sync.settings import DEV_CLIENT_STATE, SyncSettings
from services.upload.sync.wiring import InsecureSyncSettings, check_settings


def test_default_client_state_is_refused_outside_dev_mode() -> None:
    default = SyncSettings()
    assert default.client_state == DEV_CLIENT_STATE
    with pytest.raises(InsecureSyncSettings, match="SERENTAK_SYNC_CLIENT_STATE"):
        check_settings(default, "jwt")
    check_settings(default, "dev")  # make run
    check_settings(SyncSettings(client_state="a-real-secret"), "jwt")
    check_settings(SyncSettings(enabled=False), "jwt")  # no webhook server: nothing to guard
    with pytest.raises(InsecureSyncSettings):
        check_settings(SyncSettings(client_state=""), "dev")


def test_the_upload_service_refuses_to_start_with_it(tmp_path: Path) -> None:
    """build_app (what `python -m services.upload` runs) raises before serving anything."""
    settings = UploadSettings(
        data_dir=tmp_path,
        auth_mode="jwt",
        auth_jwks_url="http://127.0.0.1:9/jwks",  # complete jwt settings: never fetched here
        auth_jwt_issuer="https://idp.test",
        auth_jwt_audience="serentak",
        client_token="upload-service-token",  # its own calls' credential: start-up gets past it
    )
    with pytest.raises(InsecureSyncSettings):
        build_app(settings, sync_settings=SyncSettings())


@pytest.mark.parametrize(
    ("knobs", "complaint"),
    [
        # A check every hour could miss a subscription renewable for only 30 minutes.
        (
            {"subscription_interval_seconds": 3600, "subscription_renew_before_seconds": 1800},
            "renew_before",
        ),
        (
            {"subscription_renew_before_seconds": 7200, "subscription_lifetime_seconds": 3600},
            "lifetime",
        ),
        ({"webhook_lifecycle_path": "/webhooks/graph"}, "lifecycle_path"),
    ],
)
def test_subscription_settings_that_cannot_work_are_refused(
    knobs: dict[str, object], complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        SyncSettings(**knobs)  # type: ignore[arg-type]
