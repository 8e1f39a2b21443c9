"""job_pb2.py must be generated from the committed job.proto (regenerate: python scripts/gen_proto.py)."""
import ast
import pathlib

import pytest
from google.protobuf import descriptor_pb2

from singa_mpi.proto import job_pb2

PROTO = pathlib.Path(job_pb2.__file__).with_name("job.proto")


def test_generated_module_matches_job_proto(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc", reason="needs grpcio-tools (pip install -e '.[dev]')")
    out = tmp_path / "job.desc"
    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--descriptor_set_out={out}", str(PROTO)])
    assert status == 0
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    committed = descriptor_pb2.FileDescriptorProto.FromString(_embedded_descriptor())
    for proto in (committed, fresh):  # protoc adds json names; the runtime descriptor leaves them out
        for message in _messages(proto.message_type):
            for field in message.field:
                field.ClearField("json_name")
    assert committed == fresh, "singa_mpi/proto/job_pb2.py is stale: run python scripts/gen_proto.py"


def test_singa_enum_values_are_kept():
    # a few SINGA 0.3 values that binary records and old tools rely on
    assert job_pb2.kRecordInput == 103 and job_pb2.kSoftmaxLoss == 301 and job_pb2.kBridgeSrc == 501
    assert job_pb2.kSGD == 1 and job_pb2.kAdamMax == 7 and job_pb2.kFixedStep == 6
    assert job_pb2.kUniformSqrtFanInOut == 6 and job_pb2.kTest == 4 and job_pb2.kBPTT == 3
    record = job_pb2.RecordProto.DESCRIPTOR
    assert [(f.name, f.number) for f in record.fields] == [("shape", 1), ("label", 2), ("pixel", 3), ("data", 4)]


def _embedded_descriptor() -> bytes:
    """The serialized FileDescriptorProto that job_pb2.py hands to the descriptor pool."""
    tree = ast.parse(pathlib.Path(job_pb2.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            return ast.literal_eval(node.args[0])
    raise AssertionError("job_pb2.py has no AddSerializedFile call")


def _messages(messages):
    for message in messages:
        yield message
        yield from _messages(message.nested_type)
