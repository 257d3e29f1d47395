"""Files only the service's own user can read: folders 0700, files 0600.

Blobs and databases hold every tenant's data; nothing on the host but the service needs
to read them. The service also runs with umask 077 (`grpc_server.run_service`), but these
helpers set the modes explicitly so they hold under any umask (embedded use, tests).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dirs(path: Path) -> Path:
    """Create `path` and any missing parents 0700 (an existing leaf is tightened to 0700)."""
    path = Path(path)
    # One call in the usual case: a new folder in an existing one (a new file's blob
    # folder), or one that exists already.
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:  # made already (by us earlier, or a concurrent writer)
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode) and mode & 0o077:
            os.chmod(path, DIR_MODE)
        return path
    except FileNotFoundError:  # its parent is missing too: made first, then this one
        private_dirs(path.parent)
        return private_dirs(path)
    # mkdir's mode is filtered by the umask; chmod is not.
    os.chmod(path, DIR_MODE)
    return path


def private_sqlite(db_path: Path) -> None:
    """Create the SQLite file 0600 (in a 0700 folder) before SQLite opens it.

    SQLite creates `-wal`, `-shm` and `-journal` with the database file's own mode, so a
    0600 database keeps its side files 0600 too; existing ones are tightened as well.
    """
    db_path = Path(db_path)
    private_dirs(db_path.parent)
    os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT, FILE_MODE))
    for suffix in ("", "-wal", "-shm", "-journal"):
        side = Path(f"{db_path}{suffix}")
        if side.exists() and side.stat().st_mode & 0o077:
            os.chmod(side, FILE_MODE)
