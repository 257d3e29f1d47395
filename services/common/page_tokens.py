"""Opaque, authenticated page tokens: a keyset position no client can forge or read into.

A token is `base64url(json([purpose, *position])) "." base64url(hmac_sha256(key, body)[:16])`.
The MAC is checked (in constant time) before the body is parsed, so the JSON decoder only
ever sees bytes this deployment wrote: a forged, truncated, deeply nested or garbage token
is INVALID_ARGUMENT / INVALID_PAGE_TOKEN, never a parser error. `purpose` names the RPC
(and whatever the position is relative to), so a token from one listing cannot be replayed
against another. The key comes from settings (`SERENTAK_PAGE_TOKEN_SECRET`); replicas of
one deployment must share it for a token to survive a hop between them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json

from services.common.errors import InvalidArgument

# Far above any token we issue (a name of 255 chars + an id + a timestamp); checked first
# so an oversized token costs nothing.
MAX_TOKEN_CHARS = 2048
_MAC_BYTES = 16


class InvalidPageToken(InvalidArgument):
    """A page token this deployment did not issue for this listing."""

    reason = "INVALID_PAGE_TOKEN"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PageTokens:
    """Signs and checks page tokens with one per-deployment key."""

    def __init__(self, secret: str | bytes) -> None:
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) < 16:
            raise ValueError("the page token secret must be at least 16 bytes")
        # Derived, so the configured secret is never used as-is for anything else.
        self._key = hashlib.sha256(b"serentak-page-token\0" + key).digest()

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:_MAC_BYTES]

    def encode(self, purpose: str, position: list[str | int]) -> str:
        """A token for keyset `position` (the last row's sort key) in listing `purpose`."""
        body = json.dumps([purpose, *position], separators=(",", ":")).encode()
        return f"{_b64(body)}.{_b64(self._mac(body))}"

    def decode(
        self, token: str, purpose: str, arity: int, field: str = "page_token"
    ) -> list[str | int] | None:
        """The position in `token` (None when empty); INVALID_PAGE_TOKEN unless we issued it."""
        if not token:
            return None
        bad = InvalidPageToken(field, "is not a page token from a previous page of this listing")
        if len(token) > MAX_TOKEN_CHARS or not token.isascii() or token.count(".") != 1:
            raise bad
        body_text, mac_text = token.split(".")
        try:
            body, mac = _unb64(body_text), _unb64(mac_text)
        except (binascii.Error, ValueError):
            raise bad from None
        if not hmac.compare_digest(mac, self._mac(body)):
            raise bad
        value = json.loads(body)  # ours: the MAC matched
        if not isinstance(value, list) or len(value) != arity + 1 or value[0] != purpose:
            raise bad
        position: list[str | int] = value[1:]
        return position
