"""A real S3-compatible server (s3s-fs) on 127.0.0.1, in a folder of its own.

s3s-fs (`cargo install --locked s3s-fs@0.14.1 --features binary`; `.ci/run` installs it)
serves every folder under its root as a bucket, with SigV4 authentication, multipart
uploads and range reads. Gaps: it answers AccessDenied (not NoSuchUpload) to
AbortMultipartUpload of an upload it no longer knows, and NotImplemented to
ListMultipartUploads; its multipart state is `.upload*` files in its root folder.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

from support.ports import free_port
from support.process import LocalServer

BINARY_ENV = "S3S_FS_BIN"
DEFAULT_BUCKET = "serentak"


def s3s_binary() -> str | None:
    """The s3s-fs executable: $S3S_FS_BIN, on PATH, or in ~/.cargo/bin."""
    candidates = [os.environ.get(BINARY_ENV), shutil.which("s3s-fs")]
    candidates.append(str(Path.home() / ".cargo" / "bin" / "s3s-fs"))
    for found in candidates:
        if found and os.access(found, os.X_OK):
            return found
    return None


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class S3Server(LocalServer):
    """One s3s-fs process. `stop()` then `start()` keeps its data and port (a restart)."""

    name = "s3s-fs"

    def __init__(self, root: Path, binary: str | None = None) -> None:
        found = binary or s3s_binary()
        if found is None:
            raise RuntimeError("no s3s-fs binary: set S3S_FS_BIN or run .ci/run")
        self.binary = found
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.access_key = f"test-{uuid.uuid4().hex[:8]}"
        self.secret_key = uuid.uuid4().hex
        self.region = "us-east-1"
        self.bucket = self.create_bucket(DEFAULT_BUCKET)
        self.log_path = root.parent / f"{root.name}.log"

    @property
    def endpoint(self) -> str:
        """The http:// endpoint URL."""
        return f"http://127.0.0.1:{self.port}"

    def create_bucket(self, name: str) -> str:
        """Make a bucket (a folder under the root); returns its name."""
        (self.root / name).mkdir(exist_ok=True)
        return name

    def blob_url(self, prefix: str | None = None) -> str:
        """`s3://bucket/prefix` under a fresh prefix unless one is given."""
        return f"s3://{self.bucket}/{prefix or 't-' + uuid.uuid4().hex[:12]}"

    def upload_settings(self, prefix: str | None = None) -> dict[str, Any]:
        """UploadSettings overrides that put the blobs on this server."""
        return {
            "blob_url": self.blob_url(prefix),
            "s3_endpoint": self.endpoint,
            "s3_region": self.region,
            "s3_access_key_id": self.access_key,
            "s3_secret_access_key": self.secret_key,
            "s3_allow_http": True,
        }

    def env(self, prefix: str | None = None) -> dict[str, str]:
        """The same as SERENTAK_* environment variables (for service processes)."""
        return {
            f"SERENTAK_{name.upper()}": str(value)
            for name, value in self.upload_settings(prefix).items()
        }

    def object_path(self, key: str) -> Path:
        """Where s3s-fs keeps the object `key` of the default bucket (for inspection)."""
        return self.root / self.bucket / key

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key in the default bucket under `prefix`, sorted (read from s3s-fs's
        folder: completed objects only; its metadata and multipart state live elsewhere)."""
        bucket = self.root / self.bucket
        found = (p.relative_to(bucket).as_posix() for p in bucket.rglob("*") if p.is_file())
        return sorted(k for k in found if k.startswith(prefix))

    def multipart_state(self) -> list[str]:
        """s3s-fs's unfinished multipart uploads on disk, in its root folder:
        `.upload-{id}.json`, `.upload_id-{id}.part-N`, `....upload-{id}.metadata.json`."""
        return sorted(p.name for p in self.root.iterdir() if ".upload" in p.name)

    def command(self) -> list[str]:
        """The s3s-fs command line."""
        return [
            self.binary,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--access-key",
            self.access_key,
            "--secret-key",
            self.secret_key,
            str(self.root),
        ]

    def ready(self) -> bool:
        """True once the port accepts connections."""
        return _answers(self.port)
