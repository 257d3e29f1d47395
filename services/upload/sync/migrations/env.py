"""Alembic environment of the sync engine's tables."""

from services.common.migrations_env import run
from services.upload.sync.models import metadata

run(metadata)
