"""UploadFile writes the bytes while its transaction checks and writes its rows (a local
store), and the COMMIT comes only after the bytes are stored (invariant 4: nothing names
bytes that are not durable); with a store across the network the write comes before the
transaction. Not timing-based: the write waits on a gate only the test opens, and a failed
write must fail the upload with nothing stored."""

from __future__ import annotations

import asyncio
import errno
import os
import threading

import pytest
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select

from services.common.auth import Identity
from services.common.db import read_only
from services.common.group_commit import GroupCommits
from services.upload.merge.upload_file import UploadFiles
from services.upload.models import FileRow, UploadRow
from services.upload.storage.blob_store import LocalBlobStore

GATE_TIMEOUT_S = 20.0
ALICE = Identity(tenant_id="t-bytes-first", user_id="alice")


class GatedPut(LocalBlobStore):
    """A local store whose `put` parks its thread until the gate opens (or fails, when
    told to), after telling the test it was entered."""

    def __init__(self, inner: LocalBlobStore, fail: bool = False) -> None:
        super().__init__(inner.root)
        self._loop = asyncio.get_running_loop()
        self._fail = fail
        self.entered = asyncio.Event()
        self.gate = threading.Event()

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._wait_at_gate, key)
        await super().put(key, data)

    def _wait_at_gate(self, key: str) -> None:
        self._loop.call_soon_threadsafe(self.entered.set)
        if not self.gate.wait(GATE_TIMEOUT_S):
            raise RuntimeError("gate never opened")
        if self._fail:
            raise OSError(errno.ENOSPC, "No space left on device", key)


class Recorded(GroupCommits):
    """The group committer, telling when a unit was handed to it."""

    def __init__(self, sessions) -> None:
        super().__init__(sessions)
        self.handed = asyncio.Event()

    async def run(self, work, order=(), **options):
        self.handed.set()
        return await super().run(work, order, **options)


def upload_files(
    parts, blobs: LocalBlobStore, groups: GroupCommits, *, during: bool = True
) -> UploadFiles:
    return UploadFiles(
        parts.sessions,
        parts.uploads,
        parts.chunks,
        parts.inline,
        blobs=blobs,
        locks=parts.locks,
        signals=parts.signals,
        max_chunk_size=parts.settings.max_chunk_size,
        groups=groups,
        write_during_commit=during,
    )


def request(data: bytes, name: str, crid: str) -> upload_pb2.UploadFileRequest:
    return upload_pb2.UploadFileRequest(
        client_request_id=crid, new_file=upload_pb2.NewFileTarget(name=name), data=data
    )


async def stored(parts, crid: str) -> tuple[list[UploadRow], list[FileRow]]:
    async with parts.sessions() as session:
        await read_only(session)  # a snapshot: no wait for the write lock the commit holds
        uploads = list(
            (
                await session.execute(select(UploadRow).where(UploadRow.client_request_id == crid))
            ).scalars()
        )
        files = list(
            (
                await session.execute(
                    select(FileRow).where(FileRow.id.in_([u.file_id for u in uploads]))
                )
            ).scalars()
        )
    return uploads, files


async def test_the_commit_waits_for_the_bytes(parts) -> None:
    groups = Recorded(parts.sessions)
    blobs = GatedPut(parts.blobs)
    data = os.urandom(4096)
    upload = asyncio.create_task(
        upload_files(parts, blobs, groups).upload(ALICE, request(data, "a.bin", "first"))
    )
    try:
        await asyncio.wait_for(blobs.entered.wait(), GATE_TIMEOUT_S)
        # The bytes are still being written: the commit runs meanwhile, but nothing of the
        # upload is committed, and the caller has no answer.
        await asyncio.wait_for(groups.handed.wait(), GATE_TIMEOUT_S)
        assert await stored(parts, "first") == ([], [])
        assert not upload.done()
    finally:
        blobs.gate.set()
    done = await upload
    assert (done.upload.status, done.file.version) == ("completed", 1)
    assert await blobs.read(done.file.blob_key) == data
    uploads, files = await stored(parts, "first")
    assert [u.id for u in uploads] == [done.upload.id] and [f.id for f in files] == [done.file.id]
    await groups.close()


async def test_a_failed_write_fails_the_upload_and_stores_nothing(parts) -> None:
    groups = GroupCommits(parts.sessions)
    failing = GatedPut(parts.blobs, fail=True)
    failing.gate.set()
    data = os.urandom(4096)
    with pytest.raises(OSError) as refused:
        await upload_files(parts, failing, groups).upload(ALICE, request(data, "b.bin", "again"))
    assert refused.value.errno == errno.ENOSPC
    assert await stored(parts, "again") == ([], [])
    # The client's retry of the same request makes the one version.
    working = GatedPut(parts.blobs)
    working.gate.set()
    done = await upload_files(parts, working, groups).upload(ALICE, request(data, "b.bin", "again"))
    assert (done.upload.status, done.file.version) == ("completed", 1)
    uploads, files = await stored(parts, "again")
    assert len(uploads) == 1 and len(files) == 1
    await groups.close()


async def test_with_a_remote_store_the_bytes_come_before_the_transaction(parts) -> None:
    groups = Recorded(parts.sessions)
    blobs = GatedPut(parts.blobs)
    data = os.urandom(4096)
    files = upload_files(parts, blobs, groups, during=False)
    upload = asyncio.create_task(files.upload(ALICE, request(data, "c.bin", "remote")))
    try:
        await asyncio.wait_for(blobs.entered.wait(), GATE_TIMEOUT_S)
        # No transaction waits on the write (nor holds the tenant's tree lock meanwhile).
        assert not groups.handed.is_set()
    finally:
        blobs.gate.set()
    done = await upload
    assert groups.handed.is_set() and done.file.version == 1
    await groups.close()
