"""Layer.release: a pipelined step drops a micro-batch's activations after its backward; the next
forward and backward compute exactly what a layer that never released computes."""
import tracemalloc

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
    "kConvolution": ('convolution_conf { num_filters: 3 kernel: 3 pad: 1 } param { name: "w" } param { name: "b" }',
                     (2, 6, 6)),
}
ROUTES = {"kConvolution": ("im2col", "fourier")}  # the convolution's two ways, each releasing its own


def _cases():
    return [(name, route) for name in sorted(CASES) for route in ROUTES.get(name, (None,))]


def _route(monkeypatch, route):
    if route is not None:  # the choice is the cost model's: force each way
        monkeypatch.setattr("singa_mpi.layers.fft_conv.cheaper", lambda *args, **kwargs: route == "fourier")


def _layer(type_name: str, text: str, shape, batch: int = 5):
    conf = text_format.Parse(f'name: "l" type: {type_name} {text}', job_pb2.LayerProto())
    layer = LAYERS.select(conf)(conf, LayerContext(global_batch=batch))
    layer.out_shape = tuple(layer.setup([shape]))
    rng = np.random.default_rng(1)
    layer.params = []
    for spec in layer.param_specs:
        param = Param(spec.conf, spec.logical_shape, spec.shard)
        param.data[...] = rng.standard_normal(param.data.shape)
        param.zero_grad()
        layer.params.append(param)
    return layer


@pytest.mark.parametrize("type_name,route", _cases())
def test_a_released_layer_computes_what_it_computed_before(type_name, route, monkeypatch):
    _route(monkeypatch, route)
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


@pytest.mark.parametrize("type_name,route", _cases())
def test_a_released_layer_keeps_nothing_its_batch_allocated(type_name, route, monkeypatch):
    """After forward, backward and release, only the work arrays a layer reuses from batch to batch
    stay: what 1F1B's memory saving rests on (a kept array, such as LRN's scale or the Fourier
    convolution's spectra, stays allocated once per micro-batch in flight)."""
    _route(monkeypatch, route)
    text, shape = CASES[type_name]
    rows = 64  # every batch-sized array at least 1.5 KiB: above numpy's cache of small blocks
    layer = _layer(type_name, text, shape, rows)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows, *shape)).astype(np.float32)
    grad = rng.standard_normal((rows, *layer.out_shape)).astype(np.float32)

    def one_batch():
        for param in layer.params:
            param.zero_grad()
        layer.forward([x], True)
        layer.backward(grad, [True])
        for param in layer.params:  # the step computes the weight gradients it left pending
            param.finish_grad()
        layer.release()

    one_batch()  # the first batch makes the reused work arrays
    tracemalloc.start()
    try:
        one_batch()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak >= x.nbytes  # the batch's own arrays were traced ...
    assert kept < 1536, f"{kept} bytes stay allocated after release"  # ... and are gone
