"""The per-chunk read (`services/upload/ingest/chunk_reads.py`): one statement on a connection the
reader keeps, with no pre-ping. A PostgreSQL connection the server dropped is replaced and
the chunk goes through; the read finds only the caller's own uploads; it sees every commit
at once (a chunk after an abort is refused, a retry after a store is a duplicate).
SQLite and PostgreSQL.
"""

from __future__ import annotations

import os

import pytest
from support.postgres import terminate_other_sessions
from upload.upload_helpers import chunk_row_count, create_request, sha256, split

from services.common.auth import Identity
from services.common.errors import InvalidArgument
from services.upload.errors import UploadNotActive, UploadNotFound

CHUNK = 1024
ALICE = Identity(tenant_id="t-reads", user_id="alice")
BOB = Identity(tenant_id="t-reads", user_id="bob")
MALLORY = Identity(tenant_id="t-other", user_id="alice")


async def _upload(parts, chunks: int = 3):
    data = os.urandom(CHUNK * chunks)
    upload = await parts.uploads.create(ALICE, create_request(data, CHUNK, name="r.bin"))
    return upload, split(data, CHUNK)


async def test_a_dropped_connection_is_replaced_and_the_chunk_stored(parts, database_url) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("a SQLite file has no server that could drop the connection")
    upload, chunks = await _upload(parts)
    store = parts.chunks
    await store.put(ALICE, upload.id, 0, chunks[0], sha256(chunks[0]))
    assert terminate_other_sessions(database_url) >= 1  # the reader's kept connection
    stored = await store.put(ALICE, upload.id, 1, chunks[1], sha256(chunks[1]))
    assert not stored.duplicate and stored.upload.received_chunk_count == 2
    again = await store.put(ALICE, upload.id, 0, chunks[0], sha256(chunks[0]))
    assert again.duplicate
    assert await chunk_row_count(parts.sessions, upload.id) == 2


async def test_only_the_callers_own_upload_is_found(parts) -> None:
    upload, chunks = await _upload(parts)
    for other in (BOB, MALLORY):  # another user of the tenant; the same name elsewhere
        with pytest.raises(UploadNotFound):
            await parts.chunks.put(other, upload.id, 0, chunks[0], sha256(chunks[0]))
    for bad in ("", "../x", "x" * 200):
        with pytest.raises(InvalidArgument):
            await parts.chunks.put(ALICE, bad, 0, chunks[0], sha256(chunks[0]))
    assert await chunk_row_count(parts.sessions, upload.id) == 0


async def test_the_read_sees_each_commit(parts) -> None:
    upload, chunks = await _upload(parts)
    store = parts.chunks
    first = await store.put(ALICE, upload.id, 0, chunks[0], sha256(chunks[0]))
    retry = await store.put(ALICE, upload.id, 0, chunks[0], sha256(chunks[0]))
    assert (first.duplicate, retry.duplicate) == (False, True)
    await parts.uploads.abort(ALICE, upload.id)
    with pytest.raises(UploadNotActive):
        await store.put(ALICE, upload.id, 1, chunks[1], sha256(chunks[1]))
    assert await chunk_row_count(parts.sessions, upload.id) == 1
