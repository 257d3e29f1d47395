"""`serentak-migrate upload|notify|all` (`python -m services.migrate`): the migrate step.

The one module that knows every service's database, so that the runner in
`services.common.migrate` knows none: each service names its settings' URL and its
migration folders here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from services.common.config import load
from services.common.migrate import ServiceDatabase
from services.common.migrate import main as run
from services.notify import database as notify_database
from services.notify.settings import NotifySettings
from services.upload import database as upload_database
from services.upload.settings import UploadSettings


def _upload() -> tuple[str, list[tuple[Path, str]]]:
    return load(UploadSettings).database_url, upload_database.migration_locations()


def _notify() -> tuple[str, list[tuple[Path, str]]]:
    return load(NotifySettings).database_url, notify_database.migration_locations()


DATABASES: dict[str, ServiceDatabase] = {"upload": _upload, "notify": _notify}


def main(argv: Sequence[str] | None = None) -> int:
    """Upgrade the named service's database (or all of them) to this code's head."""
    return run(DATABASES, argv)


if __name__ == "__main__":
    sys.exit(main())
