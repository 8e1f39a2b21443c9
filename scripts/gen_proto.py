"""Regenerate singa_mpi/proto/job_pb2.py from job.proto.

Usage:  python scripts/gen_proto.py        (needs the `dev` extra: grpcio-tools)

The generated module is committed so that users never need protoc;
tests/proto/test_generated_current.py fails when it is stale.
"""
import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "singa_mpi" / "proto"


def main() -> int:
    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={PROTO_DIR}", str(PROTO_DIR / "job.proto")]
    status = protoc.main(args)
    if status == 0:
        print(f"wrote {PROTO_DIR / 'job_pb2.py'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
