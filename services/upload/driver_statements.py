"""Core statements compiled once for a dialect and run straight on the driver connection.

The chunk hot path's read (`chunk_reads`) and the group commit's writes
(`batch_statements`) skip SQLAlchemy's per-execution work on the event loop (on aiosqlite,
a cursor costs four thread hand-offs where `execute_fetchall` costs one). What SQLAlchemy
would still do for them is done here, once: the statement is compiled for the engine's
dialect, and values pass through the columns' own bind and result processors, so they
are stored and read exactly as through SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Column
from sqlalchemy.engine import Dialect


class DriverStatement:
    """One statement compiled for a dialect: its SQL, how to order its parameters, and
    the processors of its bound values (by name) and returned columns."""

    def __init__(
        self, statement: Any, dialect: Dialect, binds: dict[str, Column[Any]], returns: list[Any]
    ) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self._sqlite = dialect.name == "sqlite"
        # The statement's own literals (e.g. the statuses), bound under generated names.
        self.literals = {k: v for k, v in compiled.params.items() if k not in binds}
        self.names: list[str] | None = (
            list(compiled.positiontup or []) if compiled.positional else None
        )
        self.binds: dict[str, Callable[[Any], Any] | None] = {
            name: column.type.dialect_impl(dialect).bind_processor(dialect)
            for name, column in binds.items()
        }
        self.results = [
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in returns
        ]

    def params(self, values: dict[str, Any]) -> Any:
        """`values` (by bind name) processed and in the driver's parameter form."""
        processed = {
            name: value if (p := self.binds.get(name)) is None else p(value)
            for name, value in values.items()
        }
        processed.update(self.literals)
        return processed if self.names is None else [processed[n] for n in self.names]

    def rows(self, raw: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """Driver rows with each column's result processor applied."""
        return [
            [v if p is None else p(v) for v, p in zip(row, self.results, strict=True)]
            for row in raw
        ]

    async def run(self, driver: Any, values: dict[str, Any]) -> list[list[Any]]:
        """Execute on `driver` (aiosqlite or psycopg connection); the processed rows."""
        params = self.params(values)
        if self._sqlite:
            # aiosqlite: execute and fetch in one hand-off to its thread.
            return self.rows(list(await driver.execute_fetchall(self.sql, params)))
        cursor = await driver.execute(self.sql, params)
        return self.rows(await cursor.fetchall())
