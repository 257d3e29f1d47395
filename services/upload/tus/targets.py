"""What a tus upload makes: the CreateUpload request its Upload-Metadata and length stand
for (the upload service's own checks run on it), and row copies."""

from __future__ import annotations

from serentak.upload.v1 import upload_pb2

from services.upload.models import TusUploadRow


def create_request(
    metadata: dict[str, str], length: int, chunk_size: int, crid: str = ""
) -> upload_pb2.CreateUploadRequest:
    """CreateUpload for `length` bytes in tus chunks, to `file_id` (a new version) or a
    new file `filename` (or `name`) in `folder_id` (default: the caller's root)."""
    request = upload_pb2.CreateUploadRequest(
        client_request_id=crid,
        total_chunks=max(1, -(-length // chunk_size)),
        total_size=length,
        chunk_size=chunk_size,
        checksum_algorithm=upload_pb2.CHECKSUM_ALGORITHM_SHA256,
    )
    if metadata.get("file_id"):
        request.file_id = metadata["file_id"]
    else:
        name = metadata.get("filename") or metadata.get("name") or ""
        request.new_file.CopyFrom(
            upload_pb2.NewFileTarget(name=name, folder_id=metadata.get("folder_id", ""))
        )
    return request


def replace_row(row: TusUploadRow, **values: object) -> TusUploadRow:
    """A detached copy of `row` with `values` changed (the row is not re-read)."""
    copy = TusUploadRow(**{c.key: getattr(row, c.key) for c in TusUploadRow.__table__.columns})
    for key, value in values.items():
        setattr(copy, key, value)
    return copy
