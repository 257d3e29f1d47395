"""The creation, creation-with-upload and creation-defer-length extensions: POST's
statuses and headers, and what the upload makes (a new file named by Upload-Metadata)."""

from __future__ import annotations

import os

from serentak.upload.v1 import upload_pb2
from upload.tus.conftest import CHUNK, TusWorld, b64, completed_file, create, offset_of, patch


async def test_creation_makes_a_new_file_named_by_the_metadata(tus: TusWorld) -> None:
    data = os.urandom(CHUNK + 3)
    async with tus.http() as http:
        made = await create(tus, http, len(data), "report.pdf")
        assert made.status_code == 201
        location = made.headers["Location"]
        assert location.startswith("/files/") and made.headers["Upload-Offset"] == "0"
        done = await patch(tus, http, location, 0, data)
        assert done.status_code == 204
    upload, stored = await completed_file(tus, done.headers["Serentak-Upload-Id"])
    assert stored == data and upload.file_id == made.headers["Serentak-File-Id"]
    alice = tus["alice"]
    file = await alice.files.GetFile(
        upload_pb2.GetFileRequest(file_id=upload.file_id), metadata=alice.metadata
    )
    assert (file.name, file.size, file.version) == ("report.pdf", len(data), 1)


async def test_creation_with_upload_takes_the_first_bytes_in_the_post(tus: TusWorld) -> None:
    data = os.urandom(2 * CHUNK + 1)
    async with tus.http() as http:
        made = await create(
            tus,
            http,
            len(data),
            "with-body.bin",
            Content_Type="application/offset+octet-stream",
            content=data[: CHUNK + 10],
        )
        assert made.status_code == 201, made.text
        assert made.headers["Upload-Offset"] == str(CHUNK + 10)
        location = made.headers["Location"]
        done = await patch(tus, http, location, CHUNK + 10, data[CHUNK + 10 :])
        assert done.headers["Upload-Offset"] == str(len(data))
    _, stored = await completed_file(tus, done.headers["Serentak-Upload-Id"])
    assert stored == data


async def test_an_empty_upload_is_complete_on_creation(tus: TusWorld) -> None:
    async with tus.http() as http:
        made = await create(tus, http, 0, "empty.txt")
        assert (made.status_code, made.headers["Upload-Offset"]) == (201, "0")
    _, stored = await completed_file(tus, made.headers["Serentak-Upload-Id"])
    assert stored == b""


async def test_defer_length_then_set_it_in_a_later_patch(tus: TusWorld) -> None:
    data = os.urandom(2 * CHUNK + 100)
    async with tus.http() as http:
        made = await http.post(
            tus.url,
            headers=tus.headers(
                Upload_Defer_Length="1", Upload_Metadata=f"filename {b64('deferred.bin')}"
            ),
        )
        assert made.status_code == 201, made.text
        location = made.headers["Location"]
        head = await http.head(location, headers=tus.headers())
        assert head.headers["Upload-Defer-Length"] == "1" and "Upload-Length" not in head.headers
        # Bytes before the length is known: a whole chunk and part of the next.
        first = await patch(tus, http, location, 0, data[: CHUNK + 50])
        assert first.status_code == 204 and first.headers["Upload-Defer-Length"] == "1"
        assert await offset_of(tus, http, location) == CHUNK + 50
        # The last PATCH says the length; the parked bytes become the upload's chunks.
        last = await patch(
            tus, http, location, CHUNK + 50, data[CHUNK + 50 :], Upload_Length=str(len(data))
        )
        assert last.status_code == 204, last.text
        assert (last.headers["Upload-Offset"], last.headers["Upload-Length"]) == (
            str(len(data)),
            str(len(data)),
        )
        # Once set, the length is fixed.
        again = await patch(tus, http, location, len(data), b"", Upload_Length="5")
        assert again.status_code == 400
    _, stored = await completed_file(tus, last.headers["Serentak-Upload-Id"])
    assert stored == data


async def test_creation_refusals(tus: TusWorld) -> None:
    async with tus.http() as http:
        too_big = await create(tus, http, tus.settings.max_upload_bytes + 1, "huge.bin")
        assert too_big.status_code == 413
        no_length = await http.post(
            tus.url, headers=tus.headers(Upload_Metadata=f"filename {b64('x')}")
        )
        assert no_length.status_code == 400
        bad_defer = await http.post(
            tus.url, headers=tus.headers(Upload_Defer_Length="2", Upload_Metadata="filename eA==")
        )
        assert bad_defer.status_code == 400
        no_name = await http.post(tus.url, headers=tus.headers(Upload_Length="5"))
        assert no_name.status_code == 400
        bad_metadata = await http.post(
            tus.url, headers=tus.headers(Upload_Length="5", Upload_Metadata="filename !!!")
        )
        assert bad_metadata.status_code == 400
        wrong_body = await create(
            tus, http, 5, "typed.txt", Content_Type="text/plain", content=b"hello"
        )
        assert wrong_body.status_code == 415
        someone_elses = await http.post(
            tus.url,
            headers=tus.headers(
                "mallory", Upload_Length="5", Upload_Metadata=f"file_id {b64('0' * 32)}"
            ),
        )
        assert someone_elses.status_code == 404
