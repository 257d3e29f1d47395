"""`serentak admin` honours SERENTAK_TOKEN like every other command: --token first, then
SERENTAK_TOKEN, then the settings' ops credentials (SERENTAK_CLIENT_TOKEN, dev-ops)."""

from __future__ import annotations

import asyncio

from upload.cli_helpers import cli_env, one_line_error, serentak


async def test_admin_takes_the_token_from_serentak_token(stack) -> None:
    def env(**extra: str) -> dict[str, str]:
        return cli_env(SERENTAK_UPLOAD_ADDRESS=stack.upload, SERENTAK_AUTH_MODE="dev", **extra)

    as_alice, audit_as_alice, as_ops, flag_wins, settings_only = await asyncio.gather(
        serentak("admin", "stats", env=env(SERENTAK_TOKEN="dev-alice")),
        serentak("audit", env=env(SERENTAK_TOKEN="dev-alice")),
        # SERENTAK_TOKEN before the settings' token.
        serentak(
            "admin", "stats", "--json", env=env(SERENTAK_TOKEN="dev-ops", SERENTAK_CLIENT_TOKEN="x")
        ),
        serentak("admin", "stats", "--token", "dev-ops", env=env(SERENTAK_TOKEN="dev-alice")),
        serentak("admin", "stats", env=env()),
    )
    assert as_alice.code == 4 and "PERMISSION_DENIED" in one_line_error(as_alice)
    assert audit_as_alice.code == 4
    assert as_ops.code == 0, as_ops.err
    assert isinstance(as_ops.json().get("job_types", []), list)
    assert flag_wins.code == 0, flag_wins.err
    assert settings_only.code == 0, settings_only.err  # dev mode: dev-ops from the settings
