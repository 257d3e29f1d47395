"""The generated references are current, every RPC is documented, and the docs' links resolve.

docs/api.md and docs/settings.md are written by tools/gen_docs.py (`make docs`); a proto
comment or a settings field changed without re-running it fails here.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_docs", module)
    spec.loader.exec_module(module)
    return module


gen_docs = _load_generator()


@pytest.fixture(scope="module")
def descriptors() -> object:
    return gen_docs.load_descriptors()


def test_committed_docs_equal_a_fresh_generation(descriptors: object) -> None:
    fresh = {
        gen_docs.API_MD: gen_docs.render_api(descriptors),
        gen_docs.SETTINGS_MD: gen_docs.render_settings(),
    }
    stale = [
        str(path.relative_to(REPO))
        for path, text in fresh.items()
        if not path.exists() or path.read_text() != text
    ]
    assert stale == [], f"stale generated docs {stale}: run `make docs` and commit the result"


def test_every_rpc_in_every_proto_has_a_leading_comment(descriptors: object) -> None:
    assert len(gen_docs.all_rpcs(descriptors)) >= 42
    assert gen_docs.rpcs_without_comment(descriptors) == []


def test_the_generator_reads_every_settings_class() -> None:
    names = [cls.__name__ for cls, _, _ in gen_docs.settings_classes()]
    assert {"CommonSettings", "UploadSettings", "SyncSettings", "LocksSettings"} <= set(names)
    assert "NotifySettings" in names
    text = gen_docs.render_settings()
    assert "`SERENTAK_AUTH_MODE`" in text and "`SERENTAK_SYNC_CLIENT_STATE`" in text


# [text](target) and [text]: target; images too. Code spans and fenced blocks are skipped.
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s+(\S+)", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def _documents() -> list[Path]:
    docs = sorted((REPO / "docs").glob("*.md"))
    assert docs, "docs/ has no Markdown files"
    return [REPO / "README.md", REPO / "CHANGELOG.md", *docs]


def _relative_links(text: str) -> list[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", text))
    targets = _INLINE_LINK.findall(text) + _REFERENCE_LINK.findall(text)
    return [
        t
        for t in targets
        if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE) and not t.startswith("#")
    ]


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_a_file_that_exists(document: Path) -> None:
    if not document.exists():
        pytest.skip(f"{document.name} not written")
    broken = []
    for target in _relative_links(document.read_text()):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (document.parent / path).exists():
            broken.append(target)
    assert broken == [], f"{document.relative_to(REPO)} links to missing files: {broken}"


# A path in the tree: after a space, backtick, parenthesis or line start (not `kubectl ...
# deploy/notify`, a Kubernetes name); `*` globs, files an operator makes and Kubernetes
# object names are not checked.
_REPO_PATH = re.compile(r"(?:^|[\s`(])((?:services|tests|client|tools|deploy)/[\w/.*-]*\w)")
_MADE_BY_OPERATOR = {"deploy/compose/.env", "deploy/notify"}


@pytest.mark.parametrize(
    "document",
    [p for p in _documents() if p.name != "CHANGELOG.md"],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_every_repository_path_the_docs_name_exists(document: Path) -> None:
    """A module or test moved without its docs fails here (history, in CHANGELOG.md, keeps
    the paths of its time)."""
    if not document.exists():
        pytest.skip(f"{document.name} not written")
    named = {m.split("::", 1)[0] for m in _REPO_PATH.findall(document.read_text())}
    missing = sorted(
        p for p in named - _MADE_BY_OPERATOR if "*" not in p and not (REPO / p).exists()
    )
    assert missing == [], f"{document.relative_to(REPO)} names missing paths: {missing}"
