"""The tus core protocol's statuses and headers (protocol.md, "Core Protocol"): HEAD,
PATCH, OPTIONS, Tus-Resumable, and bad input that never changes a stored upload."""

from __future__ import annotations

import itertools
import os
from typing import Any

from prometheus_client import REGISTRY
from support.tracing import memory_spans
from upload.tus.conftest import CHUNK, TusWorld, completed_file, create, offset_of, patch


async def test_options_announces_versions_extensions_and_limits(tus: TusWorld) -> None:
    async with tus.http() as http:
        answer = await http.options(tus.url)
    assert answer.status_code == 204
    assert answer.headers["Tus-Version"] == "1.0.0"
    assert answer.headers["Tus-Resumable"] == "1.0.0"
    assert answer.headers["Tus-Extension"].split(",") == [
        "creation",
        "creation-with-upload",
        "creation-defer-length",
        "checksum",
        "termination",
        "expiration",
        "concatenation",
    ]
    # The smaller of the upload size limit and what max_total_chunks tus chunks hold.
    settings = tus.settings
    assert int(answer.headers["Tus-Max-Size"]) == min(
        settings.max_upload_bytes, settings.max_total_chunks * CHUNK
    )
    algorithms = answer.headers["Tus-Checksum-Algorithm"].split(",")
    assert "sha1" in algorithms and "sha256" in algorithms


async def test_missing_or_other_tus_version_is_412_and_not_processed(tus: TusWorld) -> None:
    async with tus.http() as http:
        made = await create(tus, http, 10, "v.bin")
        location = made.headers["Location"]
        for version in (None, "0.2.2"):
            headers = tus.headers(Upload_Offset="0", Content_Type="application/offset+octet-stream")
            del headers["Tus-Resumable"]
            if version is not None:
                headers["Tus-Resumable"] = version
            answer = await http.patch(location, content=b"0123456789", headers=headers)
            assert answer.status_code == 412
            assert answer.headers["Tus-Version"] == "1.0.0"
            creation = await http.post(tus.url, headers={**headers, "Upload-Length": "5"})
            assert creation.status_code == 412
        assert await offset_of(tus, http, location) == 0


async def test_head_reports_the_offset_length_and_metadata_uncached(tus: TusWorld) -> None:
    async with tus.http() as http:
        made = await create(tus, http, 3 * CHUNK, "head.bin")
        assert made.status_code == 201
        head = await http.head(made.headers["Location"], headers=tus.headers())
    assert head.status_code == 200
    assert (head.headers["Upload-Offset"], head.headers["Upload-Length"]) == ("0", str(3 * CHUNK))
    assert head.headers["Upload-Metadata"] == made.request.headers["Upload-Metadata"]
    assert head.headers["Cache-Control"] == "no-store"
    assert head.headers["Serentak-Upload-Id"] and head.headers["Serentak-File-Id"]


async def test_resume_at_any_byte_inside_a_chunk(tus: TusWorld) -> None:
    data = os.urandom(3 * CHUNK + 5)
    async with tus.http() as http:
        location = (await create(tus, http, len(data), "bytes.bin")).headers["Location"]
        # Pieces that end inside chunks, the chunk boundaries, and one byte at a time.
        cuts = [0, 1, 1000, CHUNK - 1, CHUNK, CHUNK + 7, 2 * CHUNK + 3, 2 * CHUNK + 4, len(data)]
        for start, end in itertools.pairwise(cuts):
            answer = await patch(tus, http, location, start, data[start:end])
            assert answer.status_code == 204, answer.text
            assert int(answer.headers["Upload-Offset"]) == end
            assert await offset_of(tus, http, location) == end
        upload_id = (await http.head(location, headers=tus.headers())).headers["Serentak-Upload-Id"]
    _, stored = await completed_file(tus, upload_id)
    assert stored == data


async def test_bad_input_gets_the_specs_status_and_never_changes_the_upload(
    tus: TusWorld,
) -> None:
    data = os.urandom(2 * CHUNK + 10)
    async with tus.http() as http:
        location = (await create(tus, http, len(data), "bad.bin")).headers["Location"]
        half = CHUNK + CHUNK // 2
        assert (await patch(tus, http, location, 0, data[:half])).status_code == 204
        wrong = [
            # An offset behind or ahead of the upload's: 409 Conflict.
            (await patch(tus, http, location, 0, data[:10]), 409),
            (await patch(tus, http, location, half + 1, data[half + 1 : half + 9]), 409),
            # Not application/offset+octet-stream: 415.
            (
                await http.patch(
                    location,
                    content=data[half:],
                    headers=tus.headers(Upload_Offset=str(half), Content_Type="text/plain"),
                ),
                415,
            ),
            # More bytes than the upload has left: 413.
            (await patch(tus, http, location, half, data[half:] + b"extra"), 413),
            # Another tenant's user, another user of the tenant: 404, as for no upload.
            (await patch(tus, http, location, half, data[half:], user="mallory"), 404),
            (await patch(tus, http, location, half, data[half:], user="bob"), 404),
            (await http.head(location, headers=tus.headers("mallory")), 404),
            (await http.delete(location, headers=tus.headers("bob")), 404),
            # No Upload-Offset: 400; no credential: 401.
            (
                await http.patch(
                    location,
                    content=b"x",
                    headers=tus.headers(Content_Type="application/offset+octet-stream"),
                ),
                400,
            ),
            (
                await http.head(location, headers={"Tus-Resumable": "1.0.0"}),
                401,
            ),
        ]
        for answer, status in wrong:
            assert answer.status_code == status, (answer.request.method, answer.text)
            assert "Upload-Offset" not in answer.headers
        assert await offset_of(tus, http, location) == half
        done = await patch(tus, http, location, half, data[half:])
        assert (done.status_code, done.headers["Upload-Offset"]) == (204, str(len(data)))
        upload_id = done.headers["Serentak-Upload-Id"]
    _, stored = await completed_file(tus, upload_id)
    assert stored == data


async def test_unknown_upload_is_404(tus: TusWorld) -> None:
    async with tus.http() as http:
        for tus_id in ("0" * 32, "not-an-id"):
            head = await http.head(f"{tus.url}{tus_id}", headers=tus.headers())
            assert head.status_code == 404
            answer = await patch(tus, http, f"{tus.url}{tus_id}", 0, b"x")
            assert answer.status_code == 404


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_metrics_count_requests_and_body_bytes(tus: TusWorld) -> None:
    bytes_before = _sample("serentak_tus_bytes_received_total")
    patches_before = _sample("serentak_tus_requests_total", method="PATCH", status="204")
    conflicts_before = _sample("serentak_tus_requests_total", method="PATCH", status="409")
    async with tus.http() as http:
        location = (await create(tus, http, 3000, "metered.bin")).headers["Location"]
        assert (await patch(tus, http, location, 0, b"a" * 1000)).status_code == 204
        assert (await patch(tus, http, location, 0, b"a" * 1000)).status_code == 409
        assert (await patch(tus, http, location, 1000, b"b" * 2000)).status_code == 204
    # The refused body was never read: only the applied bytes count.
    assert _sample("serentak_tus_bytes_received_total") - bytes_before == 3000
    assert (
        _sample("serentak_tus_requests_total", method="PATCH", status="204") - patches_before == 2
    )
    assert (
        _sample("serentak_tus_requests_total", method="PATCH", status="409") - conflicts_before == 1
    )


async def test_correlation_id_is_echoed_or_made(tus: TusWorld) -> None:
    async with tus.http() as http:
        made = await create(tus, http, 4, "traced.bin", X_Correlation_Id="tus-trace-1")
        fresh = await http.head(made.headers["Location"], headers=tus.headers())
    assert made.headers["X-Correlation-Id"] == "tus-trace-1"
    assert fresh.headers["X-Correlation-Id"] not in ("", "tus-trace-1")


async def test_method_override_for_clients_without_patch(tus: TusWorld) -> None:
    async with tus.http() as http:
        location = (await create(tus, http, 3, "override.bin")).headers["Location"]
        answer = await http.post(
            location,
            content=b"abc",
            headers=tus.headers(
                X_HTTP_Method_Override="PATCH",
                Upload_Offset="0",
                Content_Type="application/offset+octet-stream",
            ),
        )
        assert (answer.status_code, answer.headers["Upload-Offset"]) == (204, "3")
        gone = await http.post(location, headers=tus.headers(X_HTTP_Method_Override="DELETE"))
        assert gone.status_code == 204
        assert (await http.head(location, headers=tus.headers())).status_code == 410


async def test_a_callers_trace_runs_through_the_upload_to_its_merge(tus: TusWorld) -> None:
    trace_id = os.urandom(16).hex()
    traceparent = f"00-{trace_id}-{os.urandom(8).hex()}-01"
    with memory_spans() as spans:
        async with tus.http() as http:
            made = await create(tus, http, 2 * CHUNK, "traced.bin", traceparent=traceparent)
            done = await patch(
                tus,
                http,
                made.headers["Location"],
                0,
                os.urandom(2 * CHUNK),
                traceparent=traceparent,
            )
            assert done.status_code == 204

        def merged_in_trace(found: tuple[Any, ...]) -> bool:
            return any(
                s.name == "upload merge" and f"{s.context.trace_id:032x}" == trace_id for s in found
            )

        finished = await spans.wait_for(merged_in_trace)
    in_trace = {s.name for s in finished if f"{s.context.trace_id:032x}" == trace_id}
    assert {"tus POST", "tus PATCH", "upload merge"} <= in_trace
