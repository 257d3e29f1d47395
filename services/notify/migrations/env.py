"""Alembic environment of the notify service."""

from services.common.migrations_env import run
from services.notify.models import metadata

run(metadata)
