"""The termination extension: DELETE answers 204, the upload's URL 410 Gone afterwards,
its Serentak upload aborted and its staged bytes gone; a file it made stays."""

from __future__ import annotations

import os

from serentak.upload.v1 import upload_pb2
from upload.tus.conftest import CHUNK, TusWorld, completed_file, create, patch


async def test_terminated_upload_is_gone(tus: TusWorld) -> None:
    data = os.urandom(2 * CHUNK)
    async with tus.http() as http:
        made = await create(tus, http, len(data), "doomed.bin")
        location = made.headers["Location"]
        # A stored chunk and a staged tail.
        assert (await patch(tus, http, location, 0, data[: CHUNK + 9])).status_code == 204
        tus_id = location.rsplit("/", 1)[1]
        root = tus.parts.tus.store.tails.root  # type: ignore[union-attr]
        (tail,) = root.glob(f"{tus_id}.*")
        # Users' bytes are private whatever the umask.
        assert (root.stat().st_mode & 0o777, tail.stat().st_mode & 0o777) == (0o700, 0o600)
        deleted = await http.delete(location, headers=tus.headers())
        assert deleted.status_code == 204 and deleted.headers["Tus-Resumable"] == "1.0.0"
        assert (await http.head(location, headers=tus.headers())).status_code == 410
        assert (await patch(tus, http, location, CHUNK + 9, data[CHUNK + 9 :])).status_code == 410
        assert (await http.delete(location, headers=tus.headers())).status_code == 410
    assert not list(tus.parts.tus.store.tails.root.glob(f"{tus_id}.*"))  # type: ignore[union-attr]
    alice = tus["alice"]
    upload = await alice.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=made.headers["Serentak-Upload-Id"]),
        metadata=alice.metadata,
    )
    assert upload.status == upload_pb2.UPLOAD_STATUS_ABORTED


async def test_terminating_a_finished_upload_keeps_its_file(tus: TusWorld) -> None:
    async with tus.http() as http:
        made = await create(tus, http, 5, "kept.txt")
        done = await patch(tus, http, made.headers["Location"], 0, b"hello")
        assert done.status_code == 204
        upload, stored = await completed_file(tus, done.headers["Serentak-Upload-Id"])
        deleted = await http.delete(made.headers["Location"], headers=tus.headers())
        assert deleted.status_code == 204
    assert stored == b"hello"
    alice = tus["alice"]
    file = await alice.files.GetFile(
        upload_pb2.GetFileRequest(file_id=upload.file_id), metadata=alice.metadata
    )
    assert file.size == 5
