"""Checksum algorithms: proto enum <-> merge_core name, and hashing chunk bytes."""

from __future__ import annotations

import asyncio

from serentak.upload.v1 import upload_pb2

import merge_core
from services.common.errors import InvalidArgument

# Keyed by plain int: request fields arrive as ints.
_BY_ENUM: dict[int, str] = {
    upload_pb2.CHECKSUM_ALGORITHM_UNSPECIFIED: "sha256",
    upload_pb2.CHECKSUM_ALGORITHM_SHA256: "sha256",
    upload_pb2.CHECKSUM_ALGORITHM_CRC32C: "crc32c",
    upload_pb2.CHECKSUM_ALGORITHM_BLAKE3: "blake3",
}
_BY_NAME = {
    "sha256": upload_pb2.CHECKSUM_ALGORITHM_SHA256,
    "crc32c": upload_pb2.CHECKSUM_ALGORITHM_CRC32C,
    "blake3": upload_pb2.CHECKSUM_ALGORITHM_BLAKE3,
}
# Hex digits of each algorithm's digest.
HEX_LENGTH = {"sha256": 64, "crc32c": 8, "blake3": 64}
# Hashing more than this off the event loop keeps other calls responsive.
_THREAD_THRESHOLD = 256 * 1024


def algorithm_name(value: int, field: str = "checksum_algorithm") -> str:
    """The merge_core name of a proto ChecksumAlgorithm; unknown values are INVALID_ARGUMENT."""
    try:
        return _BY_ENUM[value]
    except KeyError:
        raise InvalidArgument(field, f"unknown checksum algorithm {value}") from None


def algorithm_enum(name: str) -> upload_pb2.ChecksumAlgorithm:
    """The proto enum value for a merge_core algorithm name."""
    return _BY_NAME.get(name, upload_pb2.CHECKSUM_ALGORITHM_UNSPECIFIED)


def normalize_hex(value: str, algorithm: str, field: str) -> str:
    """Lowercase hex of the right length for `algorithm`, or INVALID_ARGUMENT."""
    v = value.strip().lower()
    if len(v) != HEX_LENGTH[algorithm] or any(c not in "0123456789abcdef" for c in v):
        raise InvalidArgument(
            field,
            f"must be {HEX_LENGTH[algorithm]} hex digits of {algorithm}",
            reason="INVALID_CHECKSUM",
        )
    return v


def digest(data: bytes, algorithm: str) -> str:
    """Lowercase hex checksum of `data` computed by merge_core."""
    hasher = merge_core.Hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


async def digest_async(data: bytes, algorithm: str) -> str:
    """`digest`, on a worker thread for large inputs."""
    if len(data) >= _THREAD_THRESHOLD:
        return await asyncio.to_thread(digest, data, algorithm)
    return digest(data, algorithm)
