"""Files hidden from the tree by a feature above it (upstream sync's tombstones).

A hidden file stays in the database: GetFile and Download of it raise the hiding rule's error
(sync: FAILED_PRECONDITION, reason FILE_RETENTION_EXPIRED), listings leave it out, and it no
longer holds its name. The tree cannot import the features that hide files (sync imports the
tree), so each registers its rule here when its package is imported (`services.upload.sync`
does); with no rule registered nothing is hidden.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from sqlalchemy import ColumnElement, and_, true
from sqlalchemy.ext.asyncio import AsyncSession


class HidingRule(Protocol):
    """What hides a tenant's files: a check, a bulk lookup and a WHERE clause."""

    async def raise_if_hidden(self, session: AsyncSession, tenant_id: str, file_id: str) -> None:
        """Raise the rule's typed error if `file_id` is hidden."""

    async def hidden_ids(
        self, session: AsyncSession, tenant_id: str, file_ids: Iterable[str] | None
    ) -> set[str]:
        """Ids of the tenant's hidden files (of `file_ids` only, when given)."""

    def visible(
        self, file_id_column: ColumnElement[str], tenant_id_column: ColumnElement[str]
    ) -> ColumnElement[bool]:
        """A WHERE clause: the file is not hidden by this rule."""


_rules: list[HidingRule] = []


def register(rule: HidingRule) -> None:
    """Hide what `rule` hides from now on (once per rule, however often it is registered)."""
    if rule not in _rules:
        _rules.append(rule)


def rule_count() -> int:
    """How many rules are registered (a statement built with `visible` is current while
    this stays the same: rules are only ever added)."""
    return len(_rules)


async def raise_if_hidden(session: AsyncSession, tenant_id: str, file_id: str) -> None:
    """Raise the error of the first rule that hides `file_id`."""
    for rule in _rules:
        await rule.raise_if_hidden(session, tenant_id, file_id)


async def hidden_file_ids(
    session: AsyncSession, tenant_id: str, file_ids: Iterable[str] | None = None
) -> set[str]:
    """Ids of the tenant's hidden files (of `file_ids` only, when given)."""
    ids = None if file_ids is None else list(file_ids)
    hidden: set[str] = set()
    for rule in _rules:
        hidden |= await rule.hidden_ids(session, tenant_id, ids)
    return hidden


def visible(
    file_id_column: ColumnElement[str], tenant_id_column: ColumnElement[str]
) -> ColumnElement[bool]:
    """A WHERE clause for listings and name checks: no rule hides the file."""
    return and_(true(), *(rule.visible(file_id_column, tenant_id_column) for rule in _rules))
