"""`serentak admin audit-trail` (and `admin audit` given a filter): the audit trail by
tenant, user, file and time, as lines or `--json`; operators only; bad times refused."""

from __future__ import annotations

import asyncio

from upload.cli_helpers import cli_env, one_line_error, serentak


async def test_the_trail_by_file_user_and_time(stack) -> None:
    env = cli_env(SERENTAK_UPLOAD_ADDRESS=stack.upload, SERENTAK_AUTH_MODE="dev")
    async with stack.client("dev-alice") as alice:
        made = await alice.upload_file(b"hello" * 10, name="cli-trail.txt")
        file_id = made.file.file_id
        await alice.share(file_id, "bob", "viewer")
        await alice.delete(file_id)
    by_file, by_bob, as_lines, future, old_form, narrowed, as_bob, bad = await asyncio.gather(
        serentak("admin", "audit-trail", "--file", file_id, "--json", env=env),
        serentak("admin", "audit-trail", "--user", "bob", "--json", env=env),
        serentak("admin", "audit-trail", "--tenant", "acme", "--since", "1h", env=env),
        serentak("admin", "audit-trail", "--since", "2999-01-01", "--json", env=env),
        serentak(
            "admin", "audit", "--tenant", "acme", "--user", "alice", "--file", file_id,
            "--since", "1d", "--until", "2999-01-01T00:00:00+00:00", "--json", env=env,
        ),
        serentak("admin", "audit-trail", "--file", file_id, "--limit", "1", "--json", env=env),
        serentak("admin", "audit-trail", "--token", "dev-bob", env=env),
        serentak("admin", "audit-trail", "--since", "yesterday", env=env),
    )  # fmt: skip
    assert by_file.code == 0, by_file.err
    events = by_file.json()["events"]
    assert [e["action"] for e in events] == ["file.deleted", "file.shared", "file.content.updated"]
    assert {(e["tenant_id"], e["principal"], e["target_id"]) for e in events} == {
        ("acme", "alice", file_id)
    }
    assert all(e["correlation_id"] and e["at"] for e in events)
    assert by_bob.code == 0 and by_bob.json()["events"] == []
    assert as_lines.code == 0 and "file.shared" in as_lines.out and file_id in as_lines.out
    assert future.code == 0 and future.json()["events"] == []
    # `admin audit` with a filter is the trail (without one, the store audit as before).
    assert old_form.code == 0, old_form.err
    assert [e["action"] for e in old_form.json()["events"]] == [e["action"] for e in events]
    assert [e["action"] for e in narrowed.json()["events"]] == ["file.deleted"]
    assert narrowed.json()["next_page_token"]
    assert as_bob.code == 4 and "PERMISSION_DENIED" in one_line_error(as_bob)
    assert bad.code == 2 and "is not a time" in bad.err
