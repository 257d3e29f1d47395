"""A client offline across 10,000 changes catches up through pages of at most `page_size`
changes. The bounds (docs/services.md, "Change feed"): the server reads one page of log
rows and the items above them per call; each answer is at most `page_size` changes (here
under 300 bytes a change); the client needs only its copy of the view. Every change comes
once, and the copy ends equal to the listings."""

from __future__ import annotations

from serentak.upload.v1 import upload_pb2
from upload.change_helpers import FeedCopy, view
from upload.tree_helpers import folder, share

from services.upload.files.tree import new_folder
from services.upload.models import FILE, FileRow

ITEMS = 9_999  # below the shared folder: with it, 10,000 items enter bob's view
PAGE = 1000
BYTES_PER_CHANGE = 300


def _empty_file(folder_id: str, n: int) -> FileRow:
    row = new_folder("acme", folder_id, f"item-{n:05}.txt", "alice")
    row.kind = FILE
    return row


async def test_an_offline_client_catches_up_10000_changes_in_bounded_pages(
    cluster, sessions
) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    team = await folder(alice, "team")
    # Alice's folder already holds 9,999 (empty) files, written in one transaction here:
    # what is tested is the catch-up, not how the files came.
    async with sessions.begin() as session:
        session.add_all(_empty_file(team, n) for n in range(ITEMS))
    feed = FeedCopy(bob)
    await feed.catch_up()
    before = len(feed.received)

    # While bob is offline the whole folder enters his view: 10,000 changes for him.
    await share(alice, team, "bob", upload_pb2.ROLE_VIEWER)
    pages = await feed.catch_up(page_size=PAGE)

    assert [len(p.changes) for p in pages] == [PAGE] * 10
    assert [p.has_more for p in pages] == [True] * 9 + [False]
    assert max(p.ByteSize() for p in pages) <= PAGE * BYTES_PER_CHANGE
    arrived = [file_id for _, file_id, _ in feed.received[before:]]
    assert len(arrived) == len(set(arrived)) == ITEMS + 1  # each change once
    now = await view(bob)
    assert feed.items() == now
    assert len(now) == ITEMS + 1
    assert {role for _, _, _, role in now.values()} == {upload_pb2.ROLE_VIEWER}
