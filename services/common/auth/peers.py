"""mTLS: a verified client certificate's identity -> a service principal.

gRPC has already verified the chain against the server's client CA before a call runs;
here we only read the names it exposes in the call's auth context (subject alternative
names: DNS, URI such as SPIFFE ids; then the subject CN) and look them up in the
configured map. A certificate whose names map to nothing is no principal at all.
"""

from __future__ import annotations

import grpc

# Auth-context properties gRPC fills from a verified peer certificate, most specific first.
_NAME_PROPERTIES = (
    "peer_spiffe_id",
    "x509_subject_alternative_name",
    "peer_dns",
    "x509_common_name",
)


class PeerPrincipals:
    """Maps client-certificate names to service principals."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self._mapping = dict(mapping)

    def principal(self, context: grpc.aio.ServicerContext) -> str | None:
        """The principal of the call's client certificate, if it has a mapped name."""
        if not self._mapping:
            return None
        auth = context.auth_context() or {}
        if auth.get("transport_security_type") != [b"ssl"]:
            return None
        for prop in _NAME_PROPERTIES:
            for raw in auth.get(prop, ()):
                name = raw.decode(errors="replace")
                if name in self._mapping:
                    return self._mapping[name]
        return None
