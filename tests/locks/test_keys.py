"""Lock key validation and namespacing (unit: no sockets)."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.locks.keys import (
    KeySpace,
    check_owner,
    check_token,
    check_ttl,
    check_wait_timeout,
)
from services.locks.lock_views import Record

SPACE = KeySpace("/serentak/locks/")


@pytest.mark.parametrize("name", ["file:123", "file:a.b-c_d", "user:alice:inbox", "user:42:x"])
def test_valid_keys_are_namespaced_under_the_prefix_and_tenant(name: str) -> None:
    key = SPACE.lock_key(name, "acme")
    assert key.etcd_prefix == f"/serentak/locks/acme/{name}/".encode()
    assert key.contender_key(255) == f"/serentak/locks/acme/{name}/ff".encode()
    assert SPACE.split(key.contender_key(255)) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "file:",
        "file",
        "file:a/b",
        "file:a b",
        "file:.hidden",
        "user:alice",
        "user:alice:",
        "user::scope",
        "folder:1",
        "file:é",
        "file:" + "x" * 300,
        "user:" + "a" * 128 + ":" + "b" * 128,
    ],
)
def test_invalid_keys_are_rejected_naming_the_field(name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        SPACE.lock_key(name, "acme")
    assert caught.value.field == "key"
    assert caught.value.reason == "INVALID_LOCK_KEY"


def test_prefix_without_trailing_slash_gets_one() -> None:
    assert KeySpace("/x").lock_key("file:1", "t").etcd_prefix == b"/x/t/file:1/"


@pytest.mark.parametrize("tenant", ["", "a/b", "..", "../evil", "a b", "x" * 200, "é"])
def test_a_tenant_id_cannot_leave_its_folder(tenant: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        SPACE.lock_key("file:1", tenant)
    assert caught.value.field == "tenant_id"


@pytest.mark.parametrize("prefix", ["", "file:", "user:alice:", "file:12"])
def test_list_prefixes(prefix: str) -> None:
    assert SPACE.list_prefix(prefix, "acme") == b"/serentak/locks/acme/" + prefix.encode()


@pytest.mark.parametrize("prefix", ["file/", "../", "a b", "x" * 300])
def test_bad_list_prefix(prefix: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        SPACE.list_prefix(prefix, "acme")
    assert caught.value.field == "prefix"


@pytest.mark.parametrize(
    ("check", "value", "field"),
    [
        (check_ttl, 1, "ttl_seconds"),
        (check_ttl, 0, "ttl_seconds"),
        (check_ttl, 3601, "ttl_seconds"),
        (check_wait_timeout, -1, "wait_timeout_ms"),
        (check_wait_timeout, 3_600_001, "wait_timeout_ms"),
        (check_owner, "", "owner"),
        (check_owner, "x" * 129, "owner"),
        (check_owner, "bad\nowner", "owner"),
        (check_token, 0, "token"),
        (check_token, -5, "token"),
    ],
)
def test_bounds(check, value, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument) as caught:
        check(value)
    assert caught.value.field == field


def test_bounds_accept_the_limits() -> None:
    assert check_ttl(2) == 2 and check_ttl(3600) == 3600
    assert check_wait_timeout(0) == 0
    assert check_owner("worker-1") == "worker-1"
    assert check_token(1) == 1


def test_record_round_trips_and_tolerates_foreign_values() -> None:
    record = Record("w", "cid", 30, 1.5, 2.5)
    assert Record.decode(record.encode()) == record
    assert Record.decode(b"not json").owner == ""
