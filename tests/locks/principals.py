"""Dev-mode credentials the lock tests call with (settings' default token table)."""

from __future__ import annotations

USER_TOKEN = "dev-alice"  # user alice, tenant acme
SAME_TENANT_TOKEN = "dev-bob"  # user bob, tenant acme
OTHER_TENANT_TOKEN = "dev-mallory"  # user mallory, tenant evil
SERVICE_TOKEN = "dev-service-upload"  # the upload principal, as its merges lock file: keys
OPS_TOKEN = "dev-ops"  # the operator: may lock file: keys and sees every holder
# A user locks in its own space `user:{self}:{scope}`; file: keys are the merge's.
ALICE_SPACE = "user:alice:"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token`."""
    return (("authorization", f"Bearer {token}"),)
