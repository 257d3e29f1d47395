"""SDK results read enum fields as names (`serentak.sdk.named`), and still compare, hash
and serialise as the protobuf numbers code written against the raw messages expects."""

from __future__ import annotations

import copy
import pickle

import pytest
from google.protobuf.json_format import MessageToDict
from serentak.sdk import ChecksumAlgorithm, FileKind, Named, Role, UploadFailed, UploadStatus
from serentak.sdk.named import PROTO_ENUMS
from serentak.upload.v1 import upload_pb2


@pytest.mark.parametrize("enum", list(PROTO_ENUMS), ids=lambda e: e.__name__)
def test_each_enum_mirrors_its_proto_enum(enum) -> None:
    descriptor = PROTO_ENUMS[enum]
    assert {(v.number, v.name) for v in descriptor.values} == {(int(m), m.proto_name) for m in enum}
    prefix = descriptor.values[0].name.removesuffix("UNSPECIFIED")
    assert all(m.proto_name == prefix + m.name for m in enum)


def test_an_upload_reads_its_status_as_a_name_and_still_as_its_number() -> None:
    u = Named(upload_pb2.Upload(upload_id="u1", status=upload_pb2.UPLOAD_STATUS_COMPLETED))
    assert str(u.status) == "completed" and f"{u.status:>10}" == " completed"
    assert u.status is UploadStatus.COMPLETED and u.status.proto_name == "UPLOAD_STATUS_COMPLETED"
    # As before: the proto's constant, the number, a dict key, a request field.
    assert u.status == upload_pb2.UPLOAD_STATUS_COMPLETED and u.status == 3
    assert {3: "done"}[u.status] == "done"
    assert upload_pb2.ListUploadsRequest(status=u.status).status == 3
    assert u.status == "completed" and u.status == "UPLOAD_STATUS_COMPLETED"
    assert u.status != "failed" and u.status != 4
    assert u.upload_id == "u1" and not u.HasField("created_at")
    assert MessageToDict(u.message)["status"] == "UPLOAD_STATUS_COMPLETED"
    assert u == u.message and Named(u) == u and "COMPLETED" in repr(u)
    u.upload_id = "u9"
    assert u.message.upload_id == "u9"
    for again in (copy.copy(u), copy.deepcopy(u), pickle.loads(pickle.dumps(u))):
        assert isinstance(again, Named) and again == u and again.status == "completed"


def test_nested_and_repeated_fields_are_named_too() -> None:
    item = Named(
        upload_pb2.SharedItem(
            file=upload_pb2.File(
                kind=upload_pb2.FILE_KIND_FOLDER,
                role=upload_pb2.ROLE_EDITOR,
                checksum_algorithm=upload_pb2.CHECKSUM_ALGORITHM_SHA256,
            ),
            role=upload_pb2.ROLE_EDITOR,
        )
    )
    assert (item.file.kind, item.file.role, item.role) == (
        FileKind.FOLDER,
        Role.EDITOR,
        Role.EDITOR,
    )
    assert item.file.checksum_algorithm is ChecksumAlgorithm.SHA256
    assert f"{item.role} {item.file.kind}" == "editor folder"
    ranges = Named(upload_pb2.Upload(missing_ranges=[upload_pb2.IndexRange(start=1, end=3)]))
    assert [(r.start, r.end) for r in ranges.missing_ranges] == [(1, 3)]
    # Timestamps stay themselves (their own methods).
    assert Named(upload_pb2.File()).created_at.ToSeconds() == 0


def test_a_value_from_a_newer_server_stays_a_number() -> None:
    assert Named(upload_pb2.Upload(status=42)).status == 42  # type: ignore[arg-type]


def test_upload_failed_names_the_status() -> None:
    failed = UploadFailed(
        upload_pb2.Upload(upload_id="u2", status=upload_pb2.UPLOAD_STATUS_ABORTED)
    )
    assert str(failed) == "upload u2 aborted: ABORTED"
    assert failed.upload.status == "aborted"
