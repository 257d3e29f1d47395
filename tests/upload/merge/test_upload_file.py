"""UploadFile: a small file in one request, committed as a version before the answer, under
the same invariants as the job path (services/upload/merge/upload_file.py)."""

from __future__ import annotations

import asyncio
import os
import random
import uuid

import grpc
import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select
from support.grpc_errors import error_info
from upload.upload_helpers import (
    chunk_request,
    content_updated_uploads,
    create_request,
    download,
    expect_error,
    put_chunks,
    sha256,
    split,
    wait_status,
)
from upload.version_helpers import content_events

from services.common.jobs.models import applied_jobs, jobs
from services.upload.files.versions import commit_fenced
from services.upload.models import COMPLETED, ChunkRow, FileRow, UploadRow
from services.upload.storage.blob_store import content_key


def new_file(data: bytes, name: str, crid: str = "", **kw: object) -> upload_pb2.UploadFileRequest:
    """An UploadFileRequest making `name` in the caller's root."""
    return upload_pb2.UploadFileRequest(
        client_request_id=crid,
        new_file=upload_pb2.NewFileTarget(name=name),
        data=data,
        **kw,  # type: ignore[arg-type]
    )


def new_version(data: bytes, file_id: str, crid: str = "") -> upload_pb2.UploadFileRequest:
    """An UploadFileRequest for the next version of `file_id`."""
    return upload_pb2.UploadFileRequest(client_request_id=crid, file_id=file_id, data=data)


async def test_one_request_commits_the_file_before_the_answer(cluster, sessions) -> None:
    alice = cluster["alice"]
    data = os.urandom(64 * 1024)
    answer = await alice.uploads.UploadFile(
        new_file(data, "small.bin", checksum=sha256(data)), metadata=alice.metadata
    )
    upload, file = answer.upload, answer.file
    assert upload.status == upload_pb2.UPLOAD_STATUS_COMPLETED
    assert (upload.file_version, upload.final_checksum) == (1, sha256(data))
    assert (upload.total_chunks, upload.received_chunk_count, upload.total_size) == (
        1,
        1,
        len(data),
    )
    assert (file.file_id, file.name, file.version, file.size) == (
        upload.file_id,
        "small.bin",
        1,
        len(data),
    )
    assert file.checksum == sha256(data) and file.role == upload_pb2.ROLE_OWNER
    got, trailing = await download(alice, file.file_id)
    assert got == data and trailing["x-checksum"] == sha256(data)
    # A new version of the same file, in one request too.
    data2 = b"second version"
    again = await alice.uploads.UploadFile(
        new_version(data2, file.file_id), metadata=alice.metadata
    )
    assert (again.upload.file_version, again.file.version, again.file.size) == (2, 2, len(data2))
    assert (await download(alice, file.file_id))[0] == data2
    # One transaction each: no chunk, no merge job, no job record; the bytes under the
    # version's key only.
    ids = [upload.upload_id, again.upload.upload_id]
    job_keys = {f"{kind}:{i}" for kind in ("merge", "purge-chunks") for i in ids}
    async with sessions() as session:
        queued = set((await session.execute(select(jobs.c.idempotency_key))).scalars())
        keys = set((await session.execute(select(applied_jobs.c.idempotency_key))).scalars())
        chunk_rows = await session.scalar(
            select(func.count()).select_from(ChunkRow).where(ChunkRow.upload_id.in_(ids))
        )
    assert not job_keys & (queued | keys) and chunk_rows == 0
    assert await cluster.blobs.exists(content_key(file.file_id, upload.upload_id))
    assert await content_updated_uploads(cluster.settings.database_url) == [
        upload.upload_id,
        again.upload.upload_id,
    ]


async def test_empty_file(cluster) -> None:
    alice = cluster["alice"]
    answer = await alice.uploads.UploadFile(new_file(b"", "empty"), metadata=alice.metadata)
    assert answer.upload.status == upload_pb2.UPLOAD_STATUS_COMPLETED
    assert (answer.file.size, answer.file.checksum) == (0, sha256(b""))
    assert (await download(alice, answer.file.file_id))[0] == b""


UPLOADS = 200
INLINE_MAX = 8 * 1024
SENDERS = 24


@pytest.fixture
def settings_overrides() -> dict[str, object]:
    """Room for the races below: every upload open at once, no rate limit in the way;
    durability is not under test there (fsyncs off, as in test_merge_exactly_once)."""
    return {
        "max_open_uploads_per_user": 1000,
        "rate_limit_writes_per_user": 0,
        "rate_limit_writes_per_tenant": 0,
        "blob_fsync": False,
        "sqlite_synchronous": "NORMAL",
        "inline_merge_max_bytes": INLINE_MAX,
    }


async def _share(cluster, file_id: str, user: str, role: int) -> None:
    alice = cluster["alice"]
    await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=file_id, user_id=user, role=role),
        metadata=alice.metadata,
    )


async def _rows(sessions, model, *where):
    async with sessions() as session:
        return list((await session.execute(select(model).where(*where))).scalars())


async def test_racing_uploads_each_commit_exactly_one_version(cluster, sessions) -> None:
    """200 small uploads from three users by 24 concurrent senders: 100 versions of one
    shared file and 100 new files, every request sent twice concurrently (its
    client_request_id). Each
    request id makes one upload and one version, both sends answer with it, the bytes are
    right, and the outbox has one event per version."""
    alice, bob, carol = cluster["alice"], cluster["bob"], cluster["carol"]
    shared = await alice.uploads.UploadFile(new_file(b"v1", "shared.txt"), metadata=alice.metadata)
    file_id = shared.file.file_id
    await _share(cluster, file_id, "bob", upload_pb2.ROLE_EDITOR)
    await _share(cluster, file_id, "carol", upload_pb2.ROLE_EDITOR)
    # Shares are changes too: the uploads' versions follow theirs.
    base = (
        await alice.files.GetFile(
            upload_pb2.GetFileRequest(file_id=file_id), metadata=alice.metadata
        )
    ).version
    users = [alice, bob, carol]
    work: list[tuple[str, object, upload_pb2.UploadFileRequest]] = []
    sources: dict[str, bytes] = {}
    for n in range(UPLOADS):
        data = os.urandom(1 + n * 97)
        crid = f"race-{n}-{uuid.uuid4().hex[:6]}"
        sources[crid] = data
        request = (
            new_version(data, file_id, crid)
            if n % 2 == 0
            else new_file(data, f"new-{n}.bin", crid, checksum=sha256(data))
        )
        work.append((crid, users[n % 3], request))
    random.Random(3).shuffle(work)
    queue: asyncio.Queue[tuple[str, object, upload_pb2.UploadFileRequest]] = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)
    by_crid: dict[str, list[upload_pb2.UploadFileResponse]] = {}
    pending: list[str] = []

    async def send(client, request) -> upload_pb2.UploadFileResponse:
        # What a client does: MERGE_PENDING (the lock wait ran out under this contention
        # and the runtime took the job) means wait for the upload, then ask again.
        while True:
            try:
                return await client.uploads.UploadFile(request, metadata=client.metadata)
            except grpc.aio.AioRpcError as exc:
                info = error_info(exc)
                if (exc.code(), info.reason) != (grpc.StatusCode.UNAVAILABLE, "MERGE_PENDING"):
                    raise
                pending.append(info.metadata["upload_id"])
                await wait_status(
                    client, info.metadata["upload_id"], upload_pb2.UPLOAD_STATUS_COMPLETED
                )

    async def sender() -> None:
        while not queue.empty():
            crid, client, request = queue.get_nowait()
            # The same request twice, concurrently.
            by_crid[crid] = list(await asyncio.gather(send(client, request), send(client, request)))

    await asyncio.gather(*(sender() for _ in range(SENDERS)))
    # Most merge in their request; under this contention on one file some wait past the
    # lock's wait and finish by the runtime (printed: how often).
    print(f"{len(pending)} of {2 * UPLOADS} sends answered MERGE_PENDING first")
    versions = []
    for crid, (first, second) in by_crid.items():
        # Both sends answer with the same upload and version.
        assert first.upload == second.upload
        assert first.upload.status == upload_pb2.UPLOAD_STATUS_COMPLETED
        assert first.upload.final_checksum == sha256(sources[crid])
        assert (first.file.version, first.file.size) == (
            first.upload.file_version,
            len(sources[crid]),
        )
        if first.file.file_id == file_id:
            versions.append(first.upload.file_version)
        else:
            assert first.upload.file_version == 1
        key = content_key(first.file.file_id, first.upload.upload_id)
        assert await cluster.blobs.read(key) == sources[crid]
    # A new version of the shared file per upload of it, each once.
    assert sorted(versions) == list(range(base + 1, base + 1 + UPLOADS // 2))
    uploads = await _rows(sessions, UploadRow)
    assert len(uploads) == UPLOADS + 1 and all(u.status == COMPLETED for u in uploads)
    assert {u.client_request_id for u in uploads} - {""} == set(sources)
    (file,) = await _rows(sessions, FileRow, FileRow.id == file_id)
    assert file.version == base + UPLOADS // 2
    last = next(
        u for u in uploads if u.file_id == file_id and u.file_version == base + UPLOADS // 2
    )
    assert (await download(alice, file_id))[0] == sources[last.client_request_id]
    # One content event per version, each upload once; the shared file's tell the others.
    events = await content_events(cluster.settings.database_url)
    assert sorted(e.file_content_updated.upload_id for e in events) == sorted(u.id for u in uploads)
    shared_events = [e for e in events if e.aggregate_id == file_id]
    assert sorted(e.version for e in shared_events) == [
        1,
        *range(base + 1, base + 1 + UPLOADS // 2),
    ]
    for event in shared_events[1:]:
        assert sorted(event.audience_user_ids) == ["alice", "bob", "carol"]
    # Every merge job ran in its request and is gone.
    merge_jobs = await _session_rows(
        sessions, select(jobs).where(jobs.c.job_type == "upload.merge")
    )
    assert merge_jobs == []


async def test_a_retry_answers_the_same_upload_and_version(cluster, sessions) -> None:
    alice = cluster["alice"]
    request = new_file(b"once", "once.txt", "retry-1")
    first = await alice.uploads.UploadFile(request, metadata=alice.metadata)
    # A later version by another upload, then the retry of the first request.
    await alice.uploads.UploadFile(
        new_version(b"later", first.file.file_id), metadata=alice.metadata
    )
    again = await alice.uploads.UploadFile(request, metadata=alice.metadata)
    assert again.upload == first.upload
    # The file as this upload committed it (version 1, its bytes), not version 2.
    assert (again.file.version, again.file.size, again.file.checksum) == (
        1,
        4,
        sha256(b"once"),
    )
    assert len(await _rows(sessions, UploadRow, UploadRow.client_request_id == "retry-1")) == 1
    # The same request id with other bytes (same size) or another target is another request.
    await expect_error(
        alice.uploads.UploadFile(new_file(b"ONCE", "once.txt", "retry-1"), metadata=alice.metadata),
        grpc.StatusCode.ALREADY_EXISTS,
        "CLIENT_REQUEST_ID_REUSED",
    )
    await expect_error(
        alice.uploads.UploadFile(
            new_file(b"once", "other.txt", "retry-1"), metadata=alice.metadata
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        "CLIENT_REQUEST_ID_REUSED",
    )


async def test_bad_input_gets_precise_statuses_and_stores_nothing(cluster, sessions) -> None:
    alice, bob, mallory = cluster["alice"], cluster["bob"], cluster["mallory"]
    own = await alice.uploads.UploadFile(new_file(b"mine", "mine.txt"), metadata=alice.metadata)
    file_id = own.file.file_id
    await _share(cluster, file_id, "bob", upload_pb2.ROLE_VIEWER)
    cases = [
        (
            alice,
            new_file(b"x" * (cluster.settings.max_chunk_size + 1), "big.bin"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "DATA_TOO_LARGE",
        ),
        (
            alice,
            new_file(b"data", "bad.bin", checksum=sha256(b"other")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "CHECKSUM_MISMATCH",
        ),
        (
            alice,
            new_file(b"data", "bad.bin", checksum="not-hex"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_CHECKSUM",
        ),
        (
            alice,
            upload_pb2.UploadFileRequest(data=b"no target"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        ),
        (alice, new_version(b"data", "no-such-file"), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"),
        (mallory, new_version(b"data", file_id), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"),
        (
            bob,
            new_version(b"data", file_id),
            grpc.StatusCode.PERMISSION_DENIED,
            "INSUFFICIENT_ROLE",
        ),
        (
            alice,
            new_file(b"data", "mine.txt"),
            grpc.StatusCode.ALREADY_EXISTS,
            "NAME_TAKEN",
        ),
    ]
    for client, request, code, reason in cases:
        await expect_error(
            client.uploads.UploadFile(request, metadata=client.metadata), code, reason
        )
    try:
        await alice.uploads.UploadFile(new_file(b"data", "anon.bin"))
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
    else:
        raise AssertionError("an anonymous UploadFile succeeded")
    # Nothing of any refused request was stored: one upload, and the file as the share
    # left it (version 2), its content the first upload's.
    assert [u.id for u in await _rows(sessions, UploadRow)] == [own.upload.upload_id]
    (file,) = await _rows(sessions, FileRow, FileRow.kind == "file")
    assert (file.version, file.size) == (2, 4)


async def test_a_stale_commit_is_refused_by_the_fencing_check(cluster, sessions) -> None:
    """Invariant 7 on UploadFile: a newer lock holder committed (the file's last_lock_token
    is past any token this request can get); the commit is refused (ABORTED,
    STALE_FENCING_TOKEN) and leaves nothing: no upload, no version, no event, no bytes."""
    alice = cluster["alice"]
    first = await alice.uploads.UploadFile(new_file(b"v1", "fenced.txt"), metadata=alice.metadata)
    file_id = first.file.file_id
    newer = 10**15  # an etcd revision far ahead of this cluster's
    async with sessions.begin() as session:
        await commit_fenced(session, file_id, newer, size=2)
    lock_failures = REGISTRY.get_sample_value(
        "serentak_upload_merge_failures_total", {"reason": "lock"}
    )
    await expect_error(
        alice.uploads.UploadFile(
            new_version(b"stale", file_id, crid="stale-1"), metadata=alice.metadata
        ),
        grpc.StatusCode.ABORTED,
        "STALE_FENCING_TOKEN",
    )
    (file,) = await _rows(sessions, FileRow, FileRow.id == file_id)
    assert (file.version, file.size, file.last_lock_token) == (2, 2, newer)
    assert await _rows(sessions, UploadRow, UploadRow.client_request_id == "stale-1") == []
    assert [
        e.file_content_updated.upload_id
        for e in await content_events(cluster.settings.database_url)
    ] == [first.upload.upload_id]
    assert [o.key async for o in cluster.blobs.list_objects(f"files/{file_id}/")] == [
        content_key(file_id, first.upload.upload_id)
    ]
    assert (
        REGISTRY.get_sample_value("serentak_upload_merge_failures_total", {"reason": "lock"})
        == (lock_failures or 0) + 1
    )


async def _session_rows(sessions, statement):
    async with sessions() as session:
        return list((await session.execute(statement)).all())


async def test_the_last_chunk_of_a_small_upload_merges_before_its_answer(cluster) -> None:
    """SERENTAK_INLINE_MERGE_MAX_BYTES: the PutChunk (or UploadChunks) that completes an
    upload of at most that many bytes answers with it COMPLETED; a bigger one is the job
    runtime's, as before."""
    alice = cluster["alice"]
    data = os.urandom(3 * 1024)
    upload = await alice.uploads.CreateUpload(
        create_request(data, 1024, name="chunked-small"), metadata=alice.metadata
    )
    chunks = split(data, 1024)
    await put_chunks(alice, upload.upload_id, chunks, (2, 0))
    last = await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 1, chunks[1]), metadata=alice.metadata
    )
    assert last.status == upload_pb2.UPLOAD_STATUS_COMPLETED
    assert (await download(alice, upload.file_id))[0] == data
    # The same over one stream: the stream's answer carries the completed upload.
    streamed = await alice.uploads.CreateUpload(
        create_request(data, 1024, name="streamed-small"), metadata=alice.metadata
    )
    answer = await alice.uploads.UploadChunks(
        iter([chunk_request(streamed.upload_id, i, c) for i, c in enumerate(chunks)]),
        metadata=alice.metadata,
    )
    assert answer.upload.status == upload_pb2.UPLOAD_STATUS_COMPLETED
    assert answer.chunks[-1].status == upload_pb2.UPLOAD_STATUS_COMPLETED
    assert answer.upload.final_checksum == sha256(data)
    # Past the setting: the job path (the answer is at most MERGING; the runtime finishes).
    big = os.urandom(INLINE_MAX + 1)
    job = await alice.uploads.CreateUpload(
        create_request(big, 4096, name="chunked-big"), metadata=alice.metadata
    )
    answers = [
        await alice.uploads.PutChunk(chunk_request(job.upload_id, i, c), metadata=alice.metadata)
        for i, c in enumerate(split(big, 4096))
    ]
    assert answers[-1].status == upload_pb2.UPLOAD_STATUS_MERGING
    done = await wait_status(alice, job.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    assert done.final_checksum == sha256(big)
