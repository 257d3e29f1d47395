"""The allowance check's read for a group's callers (services/upload/ingest/allowance.py
`ALLOWANCE_FIGURES`) gives each the figures a read of it alone gives, and answers for one
tenant only: the one whose allowance lock it took, which keeps the figures current."""

from __future__ import annotations

from upload.upload_helpers import create_request

from services.upload.ingest.allowance import ALLOWANCE_FIGURES


async def test_figures_read_together_are_the_ones_read_alone(cluster, sessions) -> None:
    alice = cluster["alice"]
    await alice.uploads.CreateUpload(create_request(b"x" * 1000, 1000), metadata=alice.metadata)
    asked = [("acme", "alice"), ("acme", "bob"), ("globex", "alice")]
    async with sessions() as session:
        together = await ALLOWANCE_FIGURES.read(session, asked)
        alone = {key: (await ALLOWANCE_FIGURES.read(session, [key]))[key] for key in asked[:2]}
    assert together == alone
    (alice_open, open_bytes, _), (bob_open, _, _) = together.values()
    assert (alice_open, bob_open, open_bytes) == (1, 0, 1000)
