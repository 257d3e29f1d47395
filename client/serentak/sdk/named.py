"""SDK results whose enum fields read as names: `upload.status` prints `completed`, not `3`.

The SDK returns each protobuf message wrapped in `Named`: fields read as on the message,
except enum fields, which come back as members of the Python enums below. Those are
`IntEnum`s, so code written against the raw messages keeps working
(`status == upload_pb2.UPLOAD_STATUS_COMPLETED`, `status == 3`, passing it to a request),
while `str(status)`, f-strings and `status.label` give the name users expect and
`status == "completed"` reads as it says. The raw message is `result.message` (for
`MessageToDict`, `SerializeToString` or a stub). A value this client does not know (a newer
server's) stays a plain int. `tests/client/sdk/test_named.py` keeps the enums equal to
the protos'.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Generic, TypeVar

from google.protobuf import text_format
from google.protobuf.descriptor import EnumDescriptor
from google.protobuf.message import Message

from serentak.upload.v1 import upload_pb2

M = TypeVar("M", bound=Message)


class ProtoEnum(IntEnum):
    """A protobuf enum value with its name: `str()` is the short lower-case `label`."""

    @property
    def label(self) -> str:
        """`completed`, `folder`, `editor`: the name without the enum's prefix."""
        return self.name.lower()

    def __str__(self) -> str:
        return self.label

    def __format__(self, spec: str) -> str:
        return format(self.label, spec)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other in (self.label, self.name, self.proto_name)
        return int(self) == other

    __hash__ = int.__hash__

    @property
    def proto_name(self) -> str:
        """The value's name in the .proto (`UPLOAD_STATUS_COMPLETED`)."""
        return str(PROTO_ENUMS[type(self)].values_by_number[int(self)].name)


class UploadStatus(ProtoEnum):
    """`serentak.upload.v1.UploadStatus`."""

    UNSPECIFIED = 0
    UPLOADING = 1
    MERGING = 2
    COMPLETED = 3
    FAILED = 4
    ABORTED = 5
    EXPIRED = 6


class ChecksumAlgorithm(ProtoEnum):
    """`serentak.upload.v1.ChecksumAlgorithm` (UNSPECIFIED means sha256)."""

    UNSPECIFIED = 0
    SHA256 = 1
    CRC32C = 2
    BLAKE3 = 3


class FileKind(ProtoEnum):
    """`serentak.upload.v1.FileKind`."""

    UNSPECIFIED = 0
    FILE = 1
    FOLDER = 2


class Role(ProtoEnum):
    """`serentak.upload.v1.Role`."""

    UNSPECIFIED = 0
    VIEWER = 1
    EDITOR = 2
    OWNER = 3


class ChangeKind(ProtoEnum):
    """`serentak.upload.v1.ChangeKind` (what a ListChanges change did to your view)."""

    UNSPECIFIED = 0
    LISTED = 1
    CREATED = 2
    CONTENT_UPDATED = 3
    RENAMED = 4
    MOVED = 5
    DELETED = 6
    RESTORED = 7
    ENTERED_VIEW = 8
    LEFT_VIEW = 9
    SHARING_CHANGED = 10


# Each Python enum and the proto enum it mirrors.
PROTO_ENUMS: dict[type[ProtoEnum], EnumDescriptor] = {
    UploadStatus: upload_pb2.UploadStatus.DESCRIPTOR,
    ChecksumAlgorithm: upload_pb2.ChecksumAlgorithm.DESCRIPTOR,
    FileKind: upload_pb2.FileKind.DESCRIPTOR,
    Role: upload_pb2.Role.DESCRIPTOR,
    ChangeKind: upload_pb2.ChangeKind.DESCRIPTOR,
}
_BY_PROTO = {descriptor.full_name: enum for enum, descriptor in PROTO_ENUMS.items()}


def _enum(enum_name: str, value: int) -> int:
    enum = _BY_PROTO.get(enum_name)
    if enum is None:
        return value
    try:
        return enum(value)
    except ValueError:  # a value from a newer server: keep the number
        return value


class Named(Generic[M]):
    """A result message; its enum fields read as `ProtoEnum`s, nested messages as `Named`.

    Everything else (fields, `HasField`, `ListFields`, ...) is the message's own.
    """

    __slots__ = ("message",)

    def __init__(self, message: M | Named[M]) -> None:
        self.message: M = message.message if isinstance(message, Named) else message

    def __getattr__(self, name: str) -> Any:
        if name == "message":  # not set yet (copy, pickle): no recursion through it
            raise AttributeError(name)
        value = getattr(self.message, name)
        field = self.message.DESCRIPTOR.fields_by_name.get(name)
        if field is None:
            return value
        enum_type, message_type = field.enum_type, field.message_type
        if enum_type is not None:
            if field.is_repeated:
                return [_enum(enum_type.full_name, v) for v in value]
            return _enum(enum_type.full_name, value)
        # Our messages only: well-known types (Timestamp) and map entries stay as they are.
        if message_type is not None and message_type.full_name.startswith("serentak."):
            if not message_type.GetOptions().map_entry:
                return [Named(v) for v in value] if field.is_repeated else Named(value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        # Fields are set on the message, as on the raw results of before.
        if name == "message":
            object.__setattr__(self, name, value)
        else:
            setattr(self.message, name, value)

    def __copy__(self) -> Named[M]:
        return Named(self.message)

    def __deepcopy__(self, memo: dict[int, Any]) -> Named[M]:
        copied = type(self.message)()
        copied.CopyFrom(self.message)
        return Named(copied)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Named, (self.message,))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Named):
            other = other.message
        return bool(self.message == other)

    __hash__ = None  # type: ignore[assignment]  # messages are mutable

    def __repr__(self) -> str:
        text = text_format.MessageToString(self.message, as_one_line=True)
        return f"Named({type(self.message).__name__}<{text}>)"

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self.message)) | {"message"})


__all__ = [
    "ChecksumAlgorithm",
    "FileKind",
    "Named",
    "ProtoEnum",
    "Role",
    "UploadStatus",
]
