"""Who is calling: identities, the dev and jwt authenticators, mTLS principals.

See README "Running it for real" for the modes, claims mapping and principals.
"""

from services.common.auth.authenticator import Authenticator, TokenVerifier, bearer_token
from services.common.auth.identity import (
    LOCKS,
    NOTIFY,
    OPS,
    OPS_ROLE,
    PRINCIPALS,
    UPLOAD,
    Identity,
)
from services.common.auth.modes import build_authenticator, check_bind, require_mode

__all__ = [
    "LOCKS",
    "NOTIFY",
    "OPS",
    "OPS_ROLE",
    "PRINCIPALS",
    "UPLOAD",
    "Authenticator",
    "Identity",
    "TokenVerifier",
    "bearer_token",
    "build_authenticator",
    "check_bind",
    "require_mode",
]
