"""Alembic environment of the job runtime (jobs and outbox share one MetaData)."""

import services.common.outbox.models  # noqa: F401 - registers the outbox tables
from services.common.jobs.models import metadata
from services.common.migrations_env import run

run(metadata)
