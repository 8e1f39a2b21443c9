"""Layer.release: a pipelined step drops a micro-batch's activations after its backward; the next
forward and backward compute exactly what a layer that never released computes."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.layers.base import LAYERS, LayerContext
from singa_mpi.params import Param
from singa_mpi.proto import job_pb2

CASES = {
    "kInnerProduct": ('innerproduct_conf { num_output: 4 } param { name: "w" } param { name: "b" }', (6,)),
    "kReLU": ("", (6,)),
    "kSTanh": ("", (6,)),
    "kSigmoid": ("", (6,)),
    "kDropout": ("dropout_conf { dropout_ratio: 0.3 }", (6,)),
    "kLRN": ("lrn_conf { local_size: 3 alpha: 0.1 beta: 0.75 }", (4, 3, 3)),
    "kPooling": ("pooling_conf { pool: MAX kernel: 2 stride: 1 }", (2, 3, 3)),
}


def _layer(type_name: str, text: str, shape):
    conf = text_format.Parse(f'name: "l" type: {type_name} {text}', job_pb2.LayerProto())
    layer = LAYERS.select(conf)(conf, LayerContext(global_batch=5))
    layer.out_shape = tuple(layer.setup([shape]))
    rng = np.random.default_rng(1)
    layer.params = []
    for spec in layer.param_specs:
        param = Param(spec.conf, spec.logical_shape, spec.shard)
        param.data[...] = rng.standard_normal(param.data.shape)
        param.zero_grad()
        layer.params.append(param)
    return layer


@pytest.mark.parametrize("type_name", sorted(CASES))
def test_a_released_layer_computes_what_it_computed_before(type_name):
    text, shape = CASES[type_name]
    layer = _layer(type_name, text, shape)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, *shape)).astype(np.float32)
    y = layer.forward([x], True)
    grad = rng.standard_normal(y.shape).astype(np.float32)
    first = layer.backward(grad, [True])[0]
    layer.release()
    assert layer.data is None and all(getattr(layer, name) is None for name in layer.per_batch)
    again = layer.forward([x], True)
    np.testing.assert_array_equal(again, y)
    np.testing.assert_array_equal(layer.backward(grad, [True])[0], first)
