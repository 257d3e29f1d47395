"""UploadFile: a small file in one request, committed as a version before the answer, under
the same invariants as the job path (services/upload/merge/upload_file.py)."""

from __future__ import annotations

import os

from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select
from upload.upload_helpers import content_updated_uploads, download, sha256

from services.common.jobs.models import applied_jobs, jobs


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
    # The merge jobs ran here and left no row behind; each key is applied once.
    async with sessions() as session:
        assert (
            await session.scalar(
                select(func.count()).select_from(jobs).where(jobs.c.job_type == "upload.merge")
            )
            == 0
        )
        keys = set((await session.execute(select(applied_jobs.c.idempotency_key))).scalars())
    assert {f"merge:{upload.upload_id}", f"merge:{again.upload.upload_id}"} <= keys
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
