"""Notify's settings refuse bad values at start-up, naming the setting."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.common.config import CommonSettings, load
from services.notify.settings import NotifySettings


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_inline_fanout_max_stops_the_start_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SERENTAK_AUTH_MODE", "dev")
    monkeypatch.setenv("SERENTAK_INLINE_FANOUT_MAX", value)
    with pytest.raises(ValidationError, match="inline_fanout_max"):
        load(NotifySettings)


def test_inline_fanout_max_defaults_to_2000_and_accepts_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERENTAK_AUTH_MODE", "dev")
    assert load(NotifySettings).inline_fanout_max == 2_000
    monkeypatch.setenv("SERENTAK_INLINE_FANOUT_MAX", "0")
    assert load(NotifySettings).inline_fanout_max == 0


def test_retired_aggregates_outlive_every_redelivery_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A retired file's row may go only once no event of it can be redelivered: after the
    # upload service's outbox has purged them (its outbox_retention_seconds).
    monkeypatch.setenv("SERENTAK_AUTH_MODE", "dev")
    outbox = CommonSettings.model_fields["outbox_retention_seconds"].default
    assert load(NotifySettings).retired_aggregate_retention_seconds > outbox
    monkeypatch.setenv("SERENTAK_RETIRED_AGGREGATE_RETENTION_SECONDS", "0")
    with pytest.raises(ValidationError, match="retired_aggregate_retention_seconds"):
        load(NotifySettings)
