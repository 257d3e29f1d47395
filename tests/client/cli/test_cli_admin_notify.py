"""`serentak admin --service notify` reaches notify's AdminService at the settings' address."""

from __future__ import annotations

from upload.cli_helpers import cli_env, one_line_error, serentak


async def test_admin_notify_address_from_settings(stack) -> None:
    env = cli_env(SERENTAK_NOTIFY_ADDRESS=stack.notify, SERENTAK_AUTH_MODE="dev")
    stats = await serentak("admin", "--service", "notify", "stats", "--json", env=env)
    assert stats.code == 0, stats.err
    assert isinstance(stats.json().get("job_types", []), list)
    # The upload address is not asked: without SERENTAK_UPLOAD_ADDRESS it is the default,
    # where nothing listens in this test.
    as_bob = await serentak("admin", "--service", "notify", "stats", "--token", "dev-bob", env=env)
    assert as_bob.code == 4 and "PERMISSION_DENIED" in one_line_error(as_bob)
