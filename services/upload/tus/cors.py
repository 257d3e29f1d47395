"""CORS for browser tus clients (Uppy, tus-js-client): preflights and exposed headers.

Credentials are bearer tokens in `Authorization`, never cookies, so no
`Access-Control-Allow-Credentials`: an allowed origin still needs a token to do anything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from services.upload.tus.protocol import ALLOWED_HEADERS, ALLOWED_METHODS, EXPOSED_HEADERS

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PREFLIGHT_MAX_AGE = 86_400


def allowed_origins(setting: str) -> frozenset[str]:
    """`tus_cors_origins` as a set (`*`: any origin; empty: CORS off)."""
    return frozenset(o.strip().rstrip("/") for o in setting.split(",") if o.strip())


def cors_middleware(setting: str) -> Middleware:
    """A middleware answering preflights and adding CORS headers to every response (4xx
    included: a browser must be able to read a refusal) for an allowed `Origin`."""
    origins = allowed_origins(setting)

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None or not ("*" in origins or origin.rstrip("/") in origins):
            return await handler(request)
        preflight = (
            request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
        )
        if preflight:
            response: web.StreamResponse = web.Response(status=204)
            response.headers["Access-Control-Allow-Methods"] = ", ".join(ALLOWED_METHODS)
            response.headers["Access-Control-Allow-Headers"] = ", ".join(ALLOWED_HEADERS)
            response.headers["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE)
        else:
            response = await handler(request)
            response.headers["Access-Control-Expose-Headers"] = ", ".join(EXPOSED_HEADERS)
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"
        return response

    return cors
