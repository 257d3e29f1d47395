"""Lock keys: validation of the names callers use, and their place in etcd.

Callers name locks `file:{file_id}` or `user:{user_id}:{scope}` (DESIGN.md). Each tenant
has its own key space: in etcd a lock is a folder `{lock_prefix}{tenant}/{name}/` holding
one key per contender, `{lock_prefix}{tenant}/{name}/{lease_id:x}`; the holder is the key
with the lowest create revision. A tenant id can hold no `/`, so no name of one tenant
can reach into another's folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.common.errors import InvalidArgument
from services.locks.errors import InvalidLockKey

MAX_KEY_LENGTH = 256
MIN_TTL_SECONDS = 2  # etcd's minimum lease TTL
MAX_TTL_SECONDS = 3600
MAX_WAIT_TIMEOUT_MS = 3_600_000
MAX_OWNER_LENGTH = 128

_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_TENANT = re.compile(_ID)
_KEY_FORMS = (re.compile(rf"file:{_ID}"), re.compile(rf"user:{_ID}:{_ID}"))
# A List prefix is the start of a key: same alphabet, may stop anywhere.
_PREFIX = re.compile(r"[A-Za-z0-9._:-]*")


@dataclass(frozen=True)
class LockKey:
    """A validated lock name and where its contenders live in etcd."""

    name: str
    etcd_prefix: bytes  # `{lock_prefix}{name}/`, the folder of its contenders

    def contender_key(self, lease_id: int) -> bytes:
        """The etcd key of the contender holding `lease_id`."""
        return self.etcd_prefix + f"{lease_id:x}".encode()


class KeySpace:
    """Turns caller names into etcd keys under one configurable prefix."""

    def __init__(self, lock_prefix: str) -> None:
        if not lock_prefix.endswith("/"):
            lock_prefix += "/"
        self.root = lock_prefix.encode()

    def tenant_root(self, tenant: str) -> bytes:
        """The folder of every lock of `tenant` (INVALID_ARGUMENT on a malformed id)."""
        if not _TENANT.fullmatch(tenant):
            raise InvalidArgument("tenant_id", "must be 1..128 letters, digits, '.', '_' or '-'")
        return self.root + tenant.encode() + b"/"

    def lock_key(self, name: str, tenant: str, field: str = "key") -> LockKey:
        """Validate `name` (raises InvalidLockKey naming `field`) and place it in etcd."""
        if not name:
            raise InvalidLockKey(field, "is required")
        if len(name) > MAX_KEY_LENGTH:
            raise InvalidLockKey(field, f"longer than {MAX_KEY_LENGTH} characters")
        if not any(form.fullmatch(name) for form in _KEY_FORMS):
            raise InvalidLockKey(
                field,
                "must be file:{file_id} or user:{user_id}:{scope} with ids of letters, "
                "digits, '.', '_' or '-'",
            )
        return LockKey(name, self.tenant_root(tenant) + name.encode() + b"/")

    def list_prefix(self, prefix: str, tenant: str) -> bytes:
        """The etcd range prefix for List(prefix) in `tenant`; empty lists all its locks."""
        if len(prefix) > MAX_KEY_LENGTH or not _PREFIX.fullmatch(prefix):
            raise InvalidLockKey(
                "prefix", "must be the start of a lock key (letters, digits, .:_-)"
            )
        return self.tenant_root(tenant) + prefix.encode()

    def split(self, etcd_key: bytes) -> str:
        """The lock name of a contender key `{root}{tenant}/{name}/{lease}`."""
        in_tenant = etcd_key[len(self.root) :].split(b"/", 1)[-1]
        return in_tenant.rsplit(b"/", 1)[0].decode()


def check_ttl(ttl_seconds: int) -> int:
    """A lease TTL within [2 s, 1 h], else INVALID_ARGUMENT on `ttl_seconds`."""
    if not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
        raise InvalidArgument(
            "ttl_seconds", f"must be between {MIN_TTL_SECONDS} and {MAX_TTL_SECONDS} seconds"
        )
    return ttl_seconds


def check_wait_timeout(wait_timeout_ms: int) -> int:
    """A wait of 0 (try once) up to one hour, else INVALID_ARGUMENT on `wait_timeout_ms`."""
    if not 0 <= wait_timeout_ms <= MAX_WAIT_TIMEOUT_MS:
        raise InvalidArgument("wait_timeout_ms", f"must be between 0 and {MAX_WAIT_TIMEOUT_MS}")
    return wait_timeout_ms


def check_owner(owner: str) -> str:
    """A non-empty printable owner name of at most 128 characters."""
    if not owner or len(owner) > MAX_OWNER_LENGTH or not owner.isprintable():
        raise InvalidArgument("owner", f"must be 1..{MAX_OWNER_LENGTH} printable characters")
    return owner


def check_token(token: int) -> int:
    """A fencing token is an etcd revision, so it is positive."""
    if token <= 0:
        raise InvalidArgument("token", "must be a positive fencing token from Acquire")
    return token
