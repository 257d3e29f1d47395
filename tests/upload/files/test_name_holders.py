"""The name check's read for a group's names (services/upload/files/tree.py `NAME_HOLDERS`)
gives each name the holder a read of it alone gives, and answers for one tenant only: the
one whose tree lock the caller holds, which keeps the answers current."""

from __future__ import annotations

from upload.tree_helpers import folder
from upload.version_helpers import new_file

from services.upload.files.tree import NAME_HOLDERS


async def test_names_read_together_are_held_as_read_alone(cluster, sessions) -> None:
    alice = cluster["alice"]
    team = await folder(alice, "team")
    held = (await new_file(alice, b"x" * 10, "a.txt", team)).upload.file_id
    sub = await folder(alice, "sub", team)
    asked = [
        ("acme", team, "a.txt", ""),
        ("acme", team, "b.txt", ""),
        ("acme", team, "sub", ""),
        ("acme", team, "a.txt", held),  # its own name: no conflict
        ("globex", team, "a.txt", ""),  # another tenant's: not answered
    ]
    async with sessions() as session:
        together = await NAME_HOLDERS.read(session, asked)
        alone = {key: (await NAME_HOLDERS.read(session, [key]))[key] for key in asked[:4]}
    assert together == alone
    assert together == {asked[0]: held, asked[1]: None, asked[2]: sub, asked[3]: None}
