"""CORS for browser clients: a preflight from an allowed origin is answered with the tus
methods and headers; responses (refusals too) expose the tus headers; other origins get
no CORS headers."""

from __future__ import annotations

from upload.tus.conftest import ORIGIN, TusWorld, create


async def test_preflight_allows_the_tus_methods_and_headers(tus: TusWorld) -> None:
    async with tus.http() as http:
        answer = await http.options(
            f"{tus.url}0123",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "PATCH",
                "Access-Control-Request-Headers": "authorization,tus-resumable,upload-offset",
            },
        )
    assert answer.status_code == 204
    assert answer.headers["Access-Control-Allow-Origin"] == ORIGIN
    methods = {m.strip() for m in answer.headers["Access-Control-Allow-Methods"].split(",")}
    assert {"POST", "HEAD", "PATCH", "DELETE"} <= methods
    allowed = {h.strip().lower() for h in answer.headers["Access-Control-Allow-Headers"].split(",")}
    assert {
        "authorization",
        "tus-resumable",
        "upload-offset",
        "upload-length",
        "upload-metadata",
        "upload-checksum",
        "upload-concat",
        "content-type",
    } <= allowed
    assert "Access-Control-Allow-Credentials" not in answer.headers


async def test_answers_expose_the_tus_headers_to_an_allowed_origin_only(tus: TusWorld) -> None:
    async with tus.http() as http:
        made = await create(tus, http, 10, "cors.bin", Origin=ORIGIN)
        refused = await http.head(
            made.headers["Location"], headers=tus.headers("mallory", Origin=ORIGIN)
        )
        other = await create(tus, http, 10, "other.bin", Origin="https://evil.example")
    for answer in (made, refused):
        assert answer.headers["Access-Control-Allow-Origin"] == ORIGIN
        exposed = {h.strip() for h in answer.headers["Access-Control-Expose-Headers"].split(",")}
        assert {"Location", "Upload-Offset", "Upload-Length", "Tus-Resumable"} <= exposed
        assert {"Upload-Expires", "Serentak-Upload-Id"} <= exposed
    assert refused.status_code == 404
    assert other.status_code == 201 and "Access-Control-Allow-Origin" not in other.headers
