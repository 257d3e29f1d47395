"""Notify's settings refuse bad values at start-up, naming the setting."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.common.config import load
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
