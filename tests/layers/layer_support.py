"""A layer's configuration from its text, and random inputs: shared by the tests of tests/layers."""
import numpy as np
from google.protobuf import text_format

from singa_mpi.proto import job_pb2


def conf(text: str) -> job_pb2.LayerProto:
    layer = job_pb2.LayerProto()
    text_format.Parse(text, layer)
    return layer


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(0, 1, shape)
