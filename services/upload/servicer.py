"""gRPC surface of `serentak.upload.v1.UploadService` and `FileService`."""

from __future__ import annotations

from serentak.upload.v1 import upload_pb2_grpc


class UploadServicer(upload_pb2_grpc.UploadServiceServicer):
    """Every RPC answers UNIMPLEMENTED until uploads are built."""


class FileServicer(upload_pb2_grpc.FileServiceServicer):
    """Every RPC answers UNIMPLEMENTED until the file tree is built."""
