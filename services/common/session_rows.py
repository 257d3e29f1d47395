"""ORM rows for what `session_sql` statements read and write, kept in the session's
identity map as SQLAlchemy would keep them.

A row read on the driver becomes the session's persistent object for that key (the one
already there, if the session has it: what an ORM query returns too), so the session's
later `get` and flush see the same object. A row inserted on the driver turns the caller's
new object into a persistent one, its defaults filled in as a flush would. A row updated on
the driver has its new values set on the session's object, if it holds one, as the ORM's
`synchronize_session` does. None of these marks anything changed: the database already
holds these values, and a later flush writes nothing for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

R = TypeVar("R")

# Per mapped class: the keys its constructor takes (its columns' attributes).
_KEYS: dict[type, frozenset[str]] = {}


def new_object(entity: type[R], values: Mapping[str, Any]) -> R:
    """A new (transient) `entity` object holding `values`, as `entity(**values)` makes it.

    Made as SQLAlchemy makes a loaded object (the values put in its state's dict), not by
    the declarative constructor, which sets each attribute through its instrumentation
    (~3 us an attribute: 70 us for an upload's row, on the small-file path twice a file).
    Nothing differs after: an INSERT or `inserted` takes every value from that dict, and a
    later attribute set records its history from it as usual. An unknown key is refused
    (TypeError) as the constructor refuses it."""
    keys = _KEYS.get(entity)
    if keys is None:
        keys = _KEYS[entity] = frozenset(a.key for a in inspect(entity).column_attrs)
    if not keys.issuperset(values):
        unknown = sorted(set(values) - keys)
        raise TypeError(f"{unknown!r} are invalid keyword arguments for {entity.__name__}")
    obj: R = entity._sa_class_manager.new_instance()  # type: ignore[attr-defined]
    obj.__dict__.update(values)
    return obj


def loaded(session: AsyncSession, entity: type[R], row: Sequence[Any]) -> R:
    """The session's object for `row` (all of `entity`'s columns, in table order): the one
    the session holds already (its expired attributes set from `row`, as a query would),
    else a new persistent one made from `row`."""
    columns = entity.__table__.columns  # type: ignore[attr-defined]
    sync = session.sync_session
    key = identity_key(entity, tuple(row[i] for i, c in enumerate(columns) if c.primary_key))
    held = sync.identity_map.get(key)
    if held is not None:
        expired = inspect(held).expired_attributes
        for column, value in zip(columns, row, strict=True):
            if column.key in expired:
                set_committed_value(held, column.key, value)
        return held  # type: ignore[no-any-return]
    obj = new_object(entity, {c.key: v for c, v in zip(columns, row, strict=True)})
    make_transient_to_detached(obj)
    sync.add(obj)
    return obj


def refreshed(session: AsyncSession, entity: type[R], row: Sequence[Any]) -> R:
    """`loaded`, with every column of the session's object set from `row` (the row as it is
    now, e.g. an UPDATE's RETURNING: a query with `populate_existing`)."""
    obj = loaded(session, entity, row)
    for column, value in zip(entity.__table__.columns, row, strict=True):  # type: ignore[attr-defined]
        set_committed_value(obj, column.key, value)
    return obj


def insert_values(obj: Any) -> dict[str, Any]:
    """Every column's value for inserting the new `obj`: its own, or the column's constant
    default, set on `obj` as a flush would."""
    values: dict[str, Any] = {}
    for column in type(obj).__table__.columns:
        value = getattr(obj, column.key)
        if value is None and column.default is not None:
            if not column.default.is_scalar:
                raise TypeError(
                    f"{type(obj).__name__}.{column.key}: give it, its default is computed"
                )
            value = column.default.arg
            setattr(obj, column.key, value)
        values[column.key] = value
    return values


def inserted(session: AsyncSession, obj: Any) -> None:
    """Make the new `obj`, just inserted with its `insert_values`, the session's persistent
    object for its key, with nothing left to flush: as a flush leaves it, so a rollback of
    the transaction (or savepoint) turns it back into a new object, its values kept."""
    sync = session.sync_session
    sync.add(obj)
    # The flush's own last step for an inserted object (SQLAlchemy 2.1, pinned).
    sync._register_persistent({inspect(obj)})


def updated(session: AsyncSession, entity: type[Any], pk: Any, values: Mapping[str, Any]) -> None:
    """Set `values` on the session's object for `entity` `pk`, if it holds one (its row was
    just updated to them)."""
    held = session.sync_session.identity_map.get(identity_key(entity, pk))
    if held is not None:
        for key, value in values.items():
            set_committed_value(held, key, value)
