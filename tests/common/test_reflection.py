"""Reflection serves grpc.reflection.v1 and v1alpha, and the files it returns carry the protos'
comments, so `grpcurl describe` shows the documentation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2 as pb
from support.services import service_process

# A comment on NotifyService.Ingest in protos/serentak/notify/v1/notify.proto.
COMMENT = "Services only (service credential). Idempotent by event_id."


def _reflect(address: str, service: str, request: pb.ServerReflectionRequest):
    """One request on /{service}/ServerReflectionInfo (v1 and v1alpha share the messages)."""
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=pb.ServerReflectionRequest.SerializeToString,
            response_deserializer=pb.ServerReflectionResponse.FromString,
        )
        (reply,) = call(iter([request]), timeout=10)
        return reply


def test_grpcurl_describe_shows_comments_over_both_reflection_versions(tmp_path: Path) -> None:
    with service_process("notify", tmp_path, {}) as svc:
        grpcurl = str(Path(sys.executable).with_name("grpcurl"))
        described = subprocess.run(
            [grpcurl, "-plaintext", svc.address, "describe", "serentak.notify.v1.NotifyService"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert COMMENT in described
        field = subprocess.run(
            [grpcurl, "-plaintext", svc.address, "describe", "serentak.events.v1.Event"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "`event_id` is globally unique" in field

        for version in (
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ):
            listed = _reflect(svc.address, version, pb.ServerReflectionRequest(list_services=""))
            names = {s.name for s in listed.list_services_response.service}
            assert {
                "serentak.notify.v1.NotifyService",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            } <= names

            reply = _reflect(
                svc.address,
                version,
                pb.ServerReflectionRequest(
                    file_containing_symbol="serentak.notify.v1.NotifyService.Ingest"
                ),
            )
            files = [
                descriptor_pb2.FileDescriptorProto.FromString(b)
                for b in reply.file_descriptor_response.file_descriptor_proto
            ]
            by_name = {f.name: f for f in files}
            # The file, with its imports (transitively), and its source comments.
            assert {
                "serentak/notify/v1/notify.proto",
                "serentak/events/v1/events.proto",
                "google/protobuf/timestamp.proto",
            } <= set(by_name)
            comments = [
                loc.leading_comments
                for loc in by_name["serentak/notify/v1/notify.proto"].source_code_info.location
            ]
            assert any(COMMENT in c for c in comments)

            missing = _reflect(
                svc.address,
                version,
                pb.ServerReflectionRequest(file_containing_symbol="serentak.nope.v1.Nothing"),
            )
            assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
            bad = _reflect(svc.address, version, pb.ServerReflectionRequest(host="x"))
            assert bad.error_response.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
