"""Alembic environment of the upload service."""

from services.common.migrations_env import run
from services.upload.models import metadata

run(metadata)
