"""Alembic environment of the job runtime (jobs and outbox share one MetaData)."""

# Import the jobs package before the outbox: the outbox's relay imports the job runtime,
# and importing the outbox first would enter that cycle from the wrong end.
import services.common.audit.models
import services.common.jobs
import services.common.outbox.models  # noqa: F401 - registers the outbox tables
from services.common.jobs.models import metadata
from services.common.migrations_env import run

run(metadata)
