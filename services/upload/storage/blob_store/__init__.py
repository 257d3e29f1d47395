"""Where chunk and file bytes live: one interface (`base`), the local folder (`local`, the
embedded default) and S3-compatible object storage (`s3`), chosen by `SERENTAK_BLOB_URL`."""

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.upload.settings import UploadSettings
from services.upload.storage.blob_store.base import (
    BlobStore,
    ChunkRef,
    Merged,
    StoredObject,
    chunk_key,
    content_key,
    upload_prefix,
)
from services.upload.storage.blob_store.local import LocalBlobStore
from services.upload.storage.blob_store.traced import traced


def open_blob_store(
    settings: UploadSettings, sessions: async_sessionmaker[AsyncSession] | None = None
) -> BlobStore:
    """The store `settings.blob_url` names: S3-compatible, or the local folder (default).
    `sessions` (the upload database): S3 multipart uploads are recorded there."""
    if settings.blob_backend == "s3":
        # Imported here: obstore loads a native library only S3 deployments need.
        from services.upload.storage.blob_store.s3 import S3BlobStore

        return S3BlobStore.from_settings(settings, sessions)
    return LocalBlobStore(settings.blob_root, fsync=settings.blob_fsync)


__all__ = [
    "BlobStore",
    "ChunkRef",
    "LocalBlobStore",
    "Merged",
    "StoredObject",
    "chunk_key",
    "content_key",
    "open_blob_store",
    "traced",
    "upload_prefix",
]
