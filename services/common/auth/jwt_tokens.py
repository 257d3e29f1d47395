"""jwt mode: bearer JWTs verified against the keys an identity provider publishes (JWKS).

Keys are fetched with PyJWT's `PyJWKClient` and kept by `kid`. A token signed with a kid
we do not know triggers one re-fetch (at most every `min_refresh_seconds`, so random kids
cannot turn us into a JWKS hammer); the whole set is also re-fetched after
`cache_seconds`. A re-fetch replaces the set: a key the provider removed stops working.
Fetches are blocking HTTP, so they run in a worker thread, driven by the server's per-call
wrapper (`refresh_keys`, rpc_wrapper.py) before the RPC runs; `verify` itself never does I/O.
The first fetch happens at start, as the `jwks` readiness probe (`load_keys`), so a replica
is not ready before it has keys. Fetches are single-flight: a call that arrives while one is
under way waits for it (it was checked against an empty set before, issue #34).

Every way a token can be wrong has its own ErrorInfo reason (all UNAUTHENTICATED), so a
client's operator can tell an expired token from a mis-configured audience.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import jwt
from jwt import PyJWK, PyJWKClient

from services.common.auth.identity import Identity
from services.common.errors import Unauthenticated, Unavailable
from services.common.logging import get_logger
from services.common.readiness import Probe

log = get_logger(__name__)


class JwksKeys:
    """The provider's signing keys by kid, re-fetched on an unknown kid and when stale;
    `ssl_context` (a private CA's, private_ca.py) verifies an https URL, default: the
    system's roots."""

    def __init__(
        self,
        url: str,
        cache_seconds: float = 300.0,
        min_refresh_seconds: float = 5.0,
        timeout_seconds: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._client = PyJWKClient(
            url,
            cache_keys=False,
            cache_jwk_set=False,
            timeout=math.ceil(timeout_seconds),
            ssl_context=ssl_context,
        )
        self._url = url
        self._cache_seconds = cache_seconds
        self._min_refresh = min_refresh_seconds
        self._keys: dict[str, PyJWK] = {}
        self._fetched_at = -math.inf
        self._attempted_at = -math.inf
        self._thread_lock = threading.Lock()
        self._inflight: asyncio.Future[None] | None = None

    def get(self, kid: str) -> PyJWK | None:
        """The key for `kid` as of the last fetch."""
        return self._keys.get(kid)

    @property
    def loaded(self) -> bool:
        """True once a fetch has succeeded (the set may still be empty if the provider's is)."""
        return self._fetched_at > -math.inf

    def wants_refresh(self, kid: str | None) -> bool:
        """True when the set is stale, or `kid` is unknown and a fetch is allowed now."""
        now = time.monotonic()
        if now - self._fetched_at > self._cache_seconds:
            return now - self._attempted_at >= self._min_refresh
        return (
            kid is not None
            and kid not in self._keys
            and (now - self._attempted_at >= self._min_refresh)
        )

    def refresh(self) -> None:
        """Fetch the set now (blocking); on failure keep the keys we had."""
        with self._thread_lock:
            self._attempted_at = time.monotonic()
            try:
                jwk_set = self._client.get_jwk_set(refresh=True)
            except jwt.PyJWTError as exc:
                log.warning("jwks_fetch_failed", url=self._url, error=str(exc))
                return
            self._keys = {k.key_id: k for k in jwk_set.keys if k.key_id}
            self._fetched_at = time.monotonic()
            log.info("jwks_fetched", url=self._url, kids=sorted(self._keys))

    async def refresh_if_needed(self, kid: str | None) -> None:
        """Refresh in a worker thread if `wants_refresh(kid)`. Single-flight: whoever comes
        while a fetch is under way waits for that one (its attempt is already stamped, so
        `wants_refresh` would say no and send it on to an empty set)."""
        fetch = self._inflight
        if fetch is None:
            if not self.wants_refresh(kid):
                return
            fetch = self._inflight = asyncio.ensure_future(asyncio.to_thread(self.refresh))
            fetch.add_done_callback(self._fetch_done)
        # Shielded: a caller that is cancelled (deadline, client gone) leaves the fetch
        # running for the others.
        await asyncio.shield(fetch)

    def _fetch_done(self, fetch: asyncio.Future[None]) -> None:
        if self._inflight is fetch:
            self._inflight = None
        if not fetch.cancelled():
            fetch.exception()  # retrieved: every waiter may have been cancelled

    async def load(self) -> None:
        """Fetch the set unless it is fresh; Unavailable while no fetch has succeeded yet."""
        await self.refresh_if_needed(None)
        if not self.loaded:
            raise Unavailable(
                f"no signing keys fetched yet from {self._url}", reason="SIGNING_KEYS_UNAVAILABLE"
            )


@dataclass(frozen=True)
class ClaimsMapping:
    """Which claims carry tenant, user, roles and the OAuth client (for service principals)."""

    tenant: str = "tenant_id"
    user: str = "sub"
    roles: str = "roles"
    client: str = "client_id"
    # client id -> service principal: only these clients act as services.
    service_clients: tuple[tuple[str, str], ...] = ()


def _roles(value: object) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, Iterable):
        return frozenset(r for r in value if isinstance(r, str))
    return frozenset()


def _unverified_header(token: str) -> dict[str, object]:
    try:
        return jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise Unauthenticated("the bearer token is not a JWT", reason="MALFORMED_TOKEN") from exc


class JwtVerifier:
    """Verifies a bearer JWT and maps its claims to an `Identity`."""

    def __init__(
        self,
        keys: JwksKeys,
        *,
        issuer: str,
        audience: str,
        algorithms: list[str],
        leeway_seconds: float,
        claims: ClaimsMapping,
    ) -> None:
        self._keys = keys
        self._issuer = issuer
        self._audience = audience
        self._algorithms = list(algorithms)
        self._leeway = leeway_seconds
        self._claims = claims
        self._service_clients = dict(claims.service_clients)

    async def refresh_keys(self, token: str) -> None:
        """Fetch signing keys if `token`'s kid is unknown or the set is stale."""
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError:
            return  # verify() answers MALFORMED_TOKEN
        await self._keys.refresh_if_needed(kid if isinstance(kid, str) else None)

    def probes(self) -> list[Probe]:
        """The `jwks` readiness probe: not ready until the first fetch has succeeded (a
        later failed fetch keeps the keys we have, and readiness); it also re-fetches a
        stale set off the request path."""
        return [Probe("jwks", self._keys.load)]

    def verify(self, token: str) -> Identity:
        """The identity in a valid token; UNAUTHENTICATED with a precise reason otherwise."""
        header = _unverified_header(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg.lower() == "none":
            raise Unauthenticated("unsigned tokens are refused", reason="UNSIGNED_TOKEN")
        if alg not in self._algorithms:
            raise Unauthenticated(
                f"algorithm {alg} is not allowed", reason="ALGORITHM_NOT_ALLOWED", alg=alg
            )
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Unauthenticated("the token names no signing key (kid)", reason="MISSING_KEY_ID")
        key = self._keys.get(kid)
        if key is None and not self._keys.loaded:
            # Not the token's fault: the provider has not answered yet (retryable).
            raise Unavailable(
                "no signing keys fetched yet", reason="SIGNING_KEYS_UNAVAILABLE", kid=kid
            )
        if key is None:
            raise Unauthenticated("unknown signing key", reason="UNKNOWN_SIGNING_KEY", kid=kid)
        claims = self._decode(token, key)
        return self._identity(claims)

    def _decode(self, token: str, key: PyJWK) -> dict[str, object]:
        try:
            return jwt.decode(
                token,
                key=key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("the token has expired", reason="TOKEN_EXPIRED") from exc
        except jwt.ImmatureSignatureError as exc:
            raise Unauthenticated(
                "the token is not valid yet", reason="TOKEN_NOT_YET_VALID"
            ) from exc
        except jwt.InvalidAudienceError as exc:
            raise Unauthenticated(
                "the token is for another audience", reason="WRONG_AUDIENCE"
            ) from exc
        except jwt.InvalidIssuerError as exc:
            raise Unauthenticated("the token has another issuer", reason="WRONG_ISSUER") from exc
        except jwt.InvalidSignatureError as exc:
            raise Unauthenticated("the signature does not verify", reason="BAD_SIGNATURE") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthenticated(
                f"the token lacks the {exc.claim} claim", reason="MISSING_CLAIM", claim=exc.claim
            ) from exc
        except jwt.InvalidAlgorithmError as exc:
            raise Unauthenticated(str(exc), reason="ALGORITHM_NOT_ALLOWED") from exc
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"invalid token: {exc}", reason="INVALID_TOKEN") from exc

    def _identity(self, claims: dict[str, object]) -> Identity:
        mapping = self._claims
        roles = _roles(claims.get(mapping.roles))
        client = claims.get(mapping.client)
        principal = self._service_clients.get(client) if isinstance(client, str) else None
        if principal is not None:
            return Identity.for_service(principal, roles)
        tenant = claims.get(mapping.tenant)
        if not isinstance(tenant, str) or not tenant:
            raise Unauthenticated(
                f"the token has no {mapping.tenant} claim",
                reason="MISSING_TENANT_CLAIM",
                claim=mapping.tenant,
            )
        user = claims.get(mapping.user)
        if not isinstance(user, str) or not user:
            raise Unauthenticated(
                f"the token has no {mapping.user} claim",
                reason="MISSING_USER_CLAIM",
                claim=mapping.user,
            )
        return Identity(tenant_id=tenant, user_id=user, roles=roles)
