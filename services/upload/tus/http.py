"""The tus 1.0 HTTP surface (aiohttp): POST, HEAD, PATCH, DELETE, OPTIONS on `tus_path`.

Each handler checks the protocol (Tus-Resumable first: 412 without processing), identifies
the caller by the same bearer tokens as gRPC, and calls one use case of `TusUploads`
under the upload's request lock, taken before anything else in arrival order (one request at a
time per upload on this replica: a HEAD never reads an offset a PATCH is still moving, and a
HEAD sent after a cut PATCH sees what that PATCH kept). Statuses are the spec's: 409 on an offset
mismatch, 412 on a version mismatch, 413 past Upload-Length or Tus-Max-Size, 415 without
`application/offset+octet-stream`, 460 on a checksum mismatch, 400 on an unsupported
checksum algorithm, 403 on a PATCH of a final upload, 404 for an unknown upload (or
another user's or tenant's), 410 for a terminated or expired one. The upload service's
typed errors map to the nearest status, with their reason in `Serentak-Error-Reason`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import grpc
from aiohttp import web

from services.common import tracing
from services.common.auth import Authenticator, Identity
from services.common.correlation import bound_correlation_id
from services.common.errors import PermissionDenied, SerentakError
from services.common.logging import get_logger
from services.common.rate_limits import RateGate
from services.upload.metrics import TUS_REQUESTS
from services.upload.tus import protocol as tus
from services.upload.tus.bodies import body, read_file, spool
from services.upload.tus.cors import cors_middleware
from services.upload.tus.protocol import TusError
from services.upload.tus.request_locks import RequestLocks
from services.upload.tus.resources import TusState, TusUploads

log = get_logger(__name__)

_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.UNAVAILABLE: 503,
}
# Limits on size are the spec's 413; the rest of RESOURCE_EXHAUSTED is "too many".
_TOO_LARGE = {"UPLOAD_TOO_LARGE", "QUOTA_EXCEEDED"}


UPLOAD_SERVICE = "serentak.upload.v1.UploadService"


def http_status(error: SerentakError) -> int:
    """The HTTP status of a typed domain error."""
    if error.reason in _TOO_LARGE:
        return 413
    if error.reason in ("UPLOAD_EXPIRED",):
        return 410
    return _STATUS.get(error.code, 500)


def _refusal(status: int, reason: str, message: str) -> web.Response:
    headers = {"Serentak-Error-Reason": reason}
    if status == 412:
        headers["Tus-Version"] = tus.TUS_VERSION
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    phrase = "Checksum Mismatch" if status == tus.CHECKSUM_MISMATCH else None
    return web.Response(
        status=status, reason=phrase, text=f"{reason}: {message}\n", headers=headers
    )


@web.middleware
async def _correlated(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """`X-Correlation-Id` (or a new one) on the request's log lines, the chunks' merge job
    and outbox event, echoed in the answer, as `x-correlation-id` is for gRPC; and a span
    `tus METHOD` continuing the caller's W3C `traceparent`, so the merge job and the
    notifications the upload sets off are in the caller's trace."""
    with (
        bound_correlation_id(request.headers.get("X-Correlation-Id")) as cid,
        tracing.continued(
            request.headers.get("traceparent"), f"tus {_method(request)}", path=request.path
        ),
    ):
        tracing.note_correlation_id(cid)
        response = await handler(request)
        response.headers["X-Correlation-Id"] = cid
        return response


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Typed refusals become their status; anything else is a bug (500, logged)."""
    try:
        return await handler(request)
    except TusError as exc:
        return _refusal(exc.status, exc.reason, str(exc))
    except SerentakError as exc:
        refusal = _refusal(http_status(exc), exc.reason or "ERROR", str(exc))
        wait = getattr(exc, "retry_after_seconds", None)
        if isinstance(wait, int | float):
            refusal.headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return refusal
    except web.HTTPException as exc:
        return exc
    except ConnectionError:
        # The client went away mid-body: what arrived is kept (the tail); nobody to answer.
        log.info("tus_request_cut", method=request.method, path=request.path)
        return web.Response(status=400)
    except Exception:
        log.exception("tus_bug", method=request.method, path=request.path)
        return _refusal(500, "INTERNAL", "internal error")


async def _common_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Tus-Resumable on every response (the spec's examples carry it on OPTIONS too)."""
    TUS_REQUESTS.labels(_method(request), str(response.status)).inc()
    response.headers["Tus-Resumable"] = tus.TUS_VERSION
    response.headers["X-Content-Type-Options"] = "nosniff"


class TusHandlers:
    """The request handlers of one endpoint."""

    def __init__(
        self,
        store: TusUploads,
        auth: Authenticator,
        rates: RateGate,
        base_path: str,
        lock_wait_seconds: float,
    ) -> None:
        self._store = store
        self._auth = auth
        self._rates = rates
        self._base = base_path
        self._locks = RequestLocks(lock_wait_seconds)

    async def collection(self, request: web.Request) -> web.StreamResponse:
        """`tus_path`: OPTIONS (discovery) and POST (creation)."""
        method = _method(request)
        if method == "OPTIONS":
            return self.options()
        if method == "POST":
            return await self.create(request)
        raise web.HTTPMethodNotAllowed(method, ["OPTIONS", "POST"])

    async def resource(self, request: web.Request) -> web.StreamResponse:
        """`tus_path{id}`: HEAD, PATCH, DELETE, OPTIONS."""
        method = _method(request)
        tus_id = request.match_info["tus_id"]
        if method == "OPTIONS":
            return self.options()
        handlers = {"HEAD": self.head, "PATCH": self.patch, "DELETE": self.delete}
        if method not in handlers:
            raise web.HTTPMethodNotAllowed(method, ["HEAD", "PATCH", "DELETE", "OPTIONS"])
        # Taken first, before anything awaits: a request takes its turn in arrival order, so
        # a HEAD sent after a cut PATCH waits for that PATCH to keep what it received.
        async with self._locks.hold(tus_id):
            return await handlers[method](request, tus_id)

    def options(self) -> web.Response:
        """Discovery: versions, extensions, the largest upload, checksum algorithms."""
        return web.Response(
            status=204,
            headers={
                "Tus-Version": tus.TUS_VERSION,
                "Tus-Extension": ",".join(tus.EXTENSIONS),
                "Tus-Max-Size": str(self._store.max_size),
                "Tus-Checksum-Algorithm": ",".join(tus.CHECKSUM_ALGORITHMS),
            },
        )

    async def _user(self, request: web.Request) -> Identity:
        """The calling user (Tus-Resumable checked first: a mismatch is not processed)."""
        version = request.headers.get("Tus-Resumable")
        if version != tus.TUS_VERSION:
            raise TusError(
                412, "TUS_VERSION_UNSUPPORTED", f"Tus-Resumable must be {tus.TUS_VERSION}"
            )
        identity = await self._auth.identify_bearer(request.headers.get("Authorization"))
        if identity.is_service:
            raise PermissionDenied("tus uploads need a user credential", reason="USER_REQUIRED")
        return identity

    async def _spend(self, identity: Identity, like: str) -> None:
        """One unit of the family of the UploadService RPC this request stands for (its
        writes: POST as CreateUpload, each stored chunk as PutChunk; HEAD as GetUpload;
        DELETE as AbortUpload): the same limits, keys and RATE_LIMITED (429) as gRPC."""
        rate = self._rates.for_method(f"/{UPLOAD_SERVICE}/{like}")
        if rate is not None:
            await rate.take(identity)

    async def create(self, request: web.Request) -> web.Response:
        """POST: creation (+ creation-with-upload, defer-length, partial or final)."""
        identity = await self._user(request)
        headers = request.headers
        kind, partial_ids = tus.parse_concat(headers.get("Upload-Concat"), self._base)
        raw_metadata = headers.get("Upload-Metadata", "")
        metadata = tus.parse_metadata(raw_metadata)
        has_body = request.content_length != 0 and request.can_read_body
        if has_body and request.content_type != tus.OFFSET_CONTENT_TYPE:
            raise TusError(
                415, "UNSUPPORTED_MEDIA_TYPE", f"a body must be {tus.OFFSET_CONTENT_TYPE}"
            )
        await self._spend(identity, "CreateUpload")
        if kind == tus.FINAL:
            if "Upload-Length" in headers or "Upload-Defer-Length" in headers or has_body:
                raise TusError(400, "INVALID_FINAL", "a final upload has no length and no body")
            state = await self._store.concatenate(
                identity,
                partial_ids,
                raw_metadata=raw_metadata,
                metadata=metadata,
                concat=headers["Upload-Concat"].strip(),
            )
            return web.Response(status=201, headers=self._created(state))
        length = tus.non_negative(headers.get("Upload-Length"), "Upload-Length")
        defer = headers.get("Upload-Defer-Length")
        if defer is not None and defer.strip() != "1":
            raise TusError(400, "INVALID_DEFER_LENGTH", "Upload-Defer-Length must be 1")
        if (length is None) == (defer is None):
            raise TusError(
                400, "LENGTH_REQUIRED", "send exactly one of Upload-Length, Upload-Defer-Length: 1"
            )
        if length is not None and length > self._store.max_size:
            raise TusError(413, "UPLOAD_TOO_LARGE", f"Upload-Length is over {self._store.max_size}")
        row = await self._store.create(
            identity,
            kind=kind,
            length=length,
            raw_metadata=raw_metadata,
            metadata=metadata,
            concat=tus.PARTIAL if kind == tus.PARTIAL else "",
        )
        async with self._locks.hold(row.id):
            state = await self._store.state(identity, row)
            if has_body or length == 0:
                # creation-with-upload (an empty upload: its one empty chunk completes it).
                state = await self._apply(request, identity, state, None)
        return web.Response(status=201, headers=self._created(state))

    def _created(self, state: TusState) -> dict[str, str]:
        headers = {"Location": f"{self._base}{state.row.id}", **_upload_headers(state)}
        if state.offset is not None:
            headers["Upload-Offset"] = str(state.offset)
        return headers

    async def head(self, request: web.Request, tus_id: str) -> web.Response:
        """HEAD: the durable offset and what the upload was created with."""
        identity = await self._user(request)
        await self._spend(identity, "GetUpload")
        row = await self._store.load(identity, tus_id)
        state = await self._store.state(identity, row)
        headers = _upload_headers(state)
        if state.offset is not None:
            headers["Upload-Offset"] = str(state.offset)
        if state.row.upload_metadata:
            headers["Upload-Metadata"] = state.row.upload_metadata
        headers["Cache-Control"] = "no-store"
        return web.Response(status=200, headers=headers)

    async def patch(self, request: web.Request, tus_id: str) -> web.Response:
        """PATCH: bytes at Upload-Offset, which must be the durable offset."""
        identity = await self._user(request)
        if request.content_type != tus.OFFSET_CONTENT_TYPE:
            raise TusError(415, "UNSUPPORTED_MEDIA_TYPE", f"PATCH needs {tus.OFFSET_CONTENT_TYPE}")
        offset = tus.non_negative(request.headers.get("Upload-Offset"), "Upload-Offset")
        if offset is None:
            raise TusError(400, "OFFSET_REQUIRED", "PATCH needs Upload-Offset")
        tus.parse_checksum(request.headers.get("Upload-Checksum"))  # 400 before any byte
        length = tus.non_negative(request.headers.get("Upload-Length"), "Upload-Length")
        await self._spend(identity, "PutChunk")
        row = await self._store.load(identity, tus_id)
        if row.kind == tus.FINAL:
            raise TusError(403, "FINAL_UPLOAD", "a final upload takes no PATCH")
        state = await self._store.state(identity, row)
        if state.offset != offset:
            raise TusError(
                409,
                "OFFSET_MISMATCH",
                f"Upload-Offset is {offset}, the upload is at {state.offset}",
            )
        state = await self._apply(request, identity, state, length)
        headers = _upload_headers(state)
        headers["Upload-Offset"] = str(state.offset)
        return web.Response(status=204, headers=headers)

    async def _apply(
        self, request: web.Request, identity: Identity, state: TusState, length: int | None
    ) -> TusState:
        """The request's body at the state's offset (checked against every limit first)."""
        row = state.row
        assert state.offset is not None
        if length is not None and row.length is not None and length != row.length:
            raise TusError(400, "LENGTH_FIXED", "Upload-Length cannot change once set")
        final_length = row.length if row.length is not None else length
        room = (final_length if final_length is not None else self._store.max_size) - state.offset
        declared = request.content_length
        if declared is not None and declared > room:
            raise TusError(413, "UPLOAD_LENGTH_EXCEEDED", f"the body is over the {room} bytes left")
        checksum = tus.parse_checksum(request.headers.get("Upload-Checksum"))

        async def charge() -> None:
            # Each chunk a request stores after its first costs one more unit.
            await self._spend(identity, "PutChunk")

        if checksum is None and declared is not None:
            return await self._store.write(identity, state, body(request), length, charge)
        # Verified (or of unknown size) before any byte is applied: spooled to disk first.
        spooled = await spool(request, self._store.tails.root, room, checksum)
        try:
            return await self._store.write(identity, state, read_file(spooled), length, charge)
        finally:
            spooled.unlink(missing_ok=True)

    async def delete(self, request: web.Request, tus_id: str) -> web.Response:
        """DELETE (termination): 204; the URL is 410 Gone afterwards."""
        identity = await self._user(request)
        await self._spend(identity, "AbortUpload")
        row = await self._store.load(identity, tus_id)
        await self._store.terminate(identity, row)
        return web.Response(status=204)


def _method(request: web.Request) -> str:
    """The request's method, or X-HTTP-Method-Override's (for clients without PATCH)."""
    return request.headers.get("X-HTTP-Method-Override", request.method).strip().upper()


def _upload_headers(state: TusState) -> dict[str, str]:
    """Length, concat, expiry and the Serentak ids, for HEAD, PATCH and POST."""
    row = state.row
    headers: dict[str, str] = {}
    if row.length is None:
        headers["Upload-Defer-Length"] = "1"
    else:
        headers["Upload-Length"] = str(row.length)
    if row.kind == tus.PARTIAL:
        headers["Upload-Concat"] = tus.PARTIAL
    elif row.kind == tus.FINAL:
        headers["Upload-Concat"] = row.concat
    if state.expires_at is not None:
        headers["Upload-Expires"] = tus.http_date(state.expires_at)
    if state.upload is not None:
        headers["Serentak-Upload-Id"] = state.upload.id
        headers["Serentak-File-Id"] = state.upload.file_id
        # uploading, merging, completed or failed: all bytes in is not yet a version.
        headers["Serentak-Upload-Status"] = state.upload.status
    return headers


def tus_app(
    store: TusUploads,
    auth: Authenticator,
    rates: RateGate,
    *,
    base_path: str,
    cors_origins: str,
    lock_wait_seconds: float,
) -> web.Application:
    """The aiohttp application of the endpoint."""
    handlers = TusHandlers(store, auth, rates, base_path, lock_wait_seconds)
    app = web.Application(middlewares=[cors_middleware(cors_origins), _correlated, _errors])
    app.on_response_prepare.append(_common_headers)
    app.router.add_route("*", base_path, handlers.collection)
    if base_path != "/":
        app.router.add_route("*", base_path.rstrip("/"), handlers.collection)
    app.router.add_route("*", base_path + "{tus_id}", handlers.resource)
    return app
