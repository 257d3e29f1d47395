"""The documented grpcurl calls would work as written: each call of a Serentak RPC carries an
`authorization: Bearer` header (without one the answer is UNAUTHENTICATED), and a lock a
user takes lies in that user's own key space (`user:{user}:...`). A text check: grpcurl
need not be installed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", REPO / "client" / "README.md", *sorted(REPO.glob("docs/*.md"))]

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`([^`]+)`")
_RPC = re.compile(r"\bserentak\.\w+\.v1\.\w+/\w+")
_BEARER = re.compile(r"-H\s+['\"]authorization: Bearer (\S+?)['\"]")
_LOCK_KEY = re.compile(r"\"key\"\s*:\s*\"([^\"]*)\"")
# Dev tokens of users; the services' and the operator's are not users.
_USER_TOKEN = re.compile(r"^dev-(alice|bob|carol|mallory)$")


def _commands(block: str) -> list[str]:
    """A shell block's commands: lines joined across `\\` and inside a quoted string."""
    commands, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
        elif pending.count("'") % 2 == 0:
            commands.append(" ".join(pending.split()))
            pending = ""
    return commands + ([pending] if pending else [])


def grpcurl_calls(text: str) -> list[str]:
    """Each grpcurl command of a Markdown text: a line of a fenced block (with its `\\`
    continuations), or an inline code span (which may wrap)."""
    calls = []
    for block in _FENCE.findall(text):
        calls += [c for c in _commands(block) if "grpcurl " in c]
    for span in _SPAN.findall(_FENCE.sub("", text)):
        if "grpcurl " in span:
            calls.append(" ".join(span.split()))
    return calls


def problems(call: str) -> list[str]:
    """What keeps a documented grpcurl call from working as written."""
    rpc = _RPC.search(call)
    if rpc is None:  # list, describe, health: no credential needed
        return []
    bearer = _BEARER.search(call)
    if bearer is None:
        return [f"{rpc.group()} without an authorization header"]
    user = _USER_TOKEN.match(bearer.group(1))
    if user is None or "LockService" not in rpc.group():
        return []
    own = f"user:{user.group(1)}:"
    return [
        f"{rpc.group()} as {bearer.group(1)} locks {key!r}, outside {own}..."
        for key in _LOCK_KEY.findall(call)
        if not key.startswith(own)
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_grpcurl_call_carries_its_credentials(document: Path) -> None:
    found = [p for call in grpcurl_calls(document.read_text()) for p in problems(call)]
    assert found == [], f"{document.relative_to(REPO)}: {found}"


def test_the_readme_has_calls_to_check() -> None:
    calls = grpcurl_calls((REPO / "README.md").read_text())
    assert sum(1 for c in calls if "LockService/Acquire" in c) == 1
    assert len([c for c in calls if _RPC.search(c)]) >= 4


def test_the_check_catches_what_fails_against_a_server() -> None:
    anonymous = "grpcurl -plaintext -d '{}' 127.0.0.1:50052 serentak.locks.v1.LockService/Acquire"
    assert problems(anonymous) == [
        "serentak.locks.v1.LockService/Acquire without an authorization header"
    ]
    elsewhere = (
        "grpcurl -plaintext -H 'authorization: Bearer dev-alice' -d '{\"key\": \"file:7\"}' "
        "127.0.0.1:50052 serentak.locks.v1.LockService/Acquire"
    )
    assert len(problems(elsewhere)) == 1
    # A payload over several lines (quoted), then a continuation: one command.
    quoted = (
        "```sh\ngrpcurl -H 'authorization: Bearer dev-bob' -d '\n {\"key\": \"a\"}' \\\n"
        "  h serentak.locks.v1.LockService/Session\n```\n"
    )
    assert [len(problems(c)) for c in grpcurl_calls(quoted)] == [1]
    wrapped = "see `grpcurl -plaintext -H\n'authorization: Bearer dev-bob' 127.0.0.1:50053\nx`"
    assert grpcurl_calls(wrapped) == [
        "grpcurl -plaintext -H 'authorization: Bearer dev-bob' 127.0.0.1:50053 x"
    ]
