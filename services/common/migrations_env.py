"""The body of every Alembic `env.py`: run migrations online against the configured URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import MetaData, engine_from_config, pool


def run(target_metadata: MetaData | None) -> None:
    """Run the current Alembic command with the service's metadata and version table."""
    cfg = context.config
    version_table = cfg.get_main_option("version_table") or "alembic_version"
    connectable = engine_from_config(
        cfg.get_section(cfg.config_ini_section)
        or {"sqlalchemy.url": cfg.get_main_option("sqlalchemy.url")},
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=version_table,
            render_as_batch=connection.dialect.name == "sqlite",
            # Tables in the database but not in this service's metadata belong to another
            # migration folder (the job runtime's): autogenerate must not propose drops.
            include_object=_owned_by_target,
        )
        with context.begin_transaction():
            context.run_migrations()
    connectable.dispose()


def _owned_by_target(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object | None
) -> bool:
    return not (type_ == "table" and reflected and compare_to is None)
