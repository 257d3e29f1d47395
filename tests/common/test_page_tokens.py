"""PageTokens round-trips only its own tokens (unit: no sockets)."""

from __future__ import annotations

import pytest

from services.common.page_tokens import InvalidPageToken, PageTokens


def test_round_trip_and_refusals() -> None:
    tokens = PageTokens("s" * 32)
    token = tokens.encode("L:f", ["name", "id1"])
    assert tokens.decode(token, "L:f", 2) == ["name", "id1"]
    assert tokens.decode("", "L:f", 2) is None
    body, mac = token.split(".")
    for bad in (
        token[:-2],
        f"{body}x.{mac}",
        f"{body}.{mac[::-1]}",
        PageTokens("t" * 32).encode("L:f", ["name", "id1"]),
    ):
        with pytest.raises(InvalidPageToken):
            tokens.decode(bad, "L:f", 2)
    with pytest.raises(InvalidPageToken):
        tokens.decode(token, "L:g", 2)  # another listing
    with pytest.raises(InvalidPageToken):
        tokens.decode(token, "L:f", 3)  # another shape


def test_short_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        PageTokens("short")
