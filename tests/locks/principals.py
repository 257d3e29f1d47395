"""Dev-mode credentials the lock tests call with (settings' default token table)."""

from __future__ import annotations

USER_TOKEN = "dev-alice"  # user alice, tenant acme
SAME_TENANT_TOKEN = "dev-bob"  # user bob, tenant acme
OTHER_TENANT_TOKEN = "dev-mallory"  # user mallory, tenant evil
SERVICE_TOKEN = "dev-service-upload"  # the upload principal, as its merges lock file: keys


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token`."""
    return (("authorization", f"Bearer {token}"),)
