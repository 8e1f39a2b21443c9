"""Each layer family's declaration of the memory it allocates besides its output (Layer.work_bytes, which
the memory check adds up) against what a forward and backward really allocate, measured by tracemalloc
(numpy reports every array's data to it): held (still allocated after backward, besides the output and
the gradients) within 10%, passing (the most allocated at once inside one pass, beyond what stays)
within 25%, and either within 128 KiB (a declaration counts the arrays that matter, not every small
temporary: the cases allocate megabytes)."""
import gc
import tracemalloc

import numpy as np
import pytest

from singa_mpi.layers.base import layer_class_of
from singa_mpi.testing import build_layer

W = 'param { name: "w" init { type: kGaussian std: 0.01 } } param { name: "b" init { type: kConstant value: 0 } }'
FAMILIES = [  # (layer text, per-sample input shape, rows): convolutions by im2col (columns kept whole, made
    # in chunks, strided) and through the Fourier transform, MAX (padded or not) and AVG pooling, ...
    (f'name: "c" type: kCConvolution convolution_conf {{ num_filters: 16 kernel: 3 pad: 1 }} {W}', (3, 16, 16), 8),
    (f'name: "c" type: kCConvolution convolution_conf {{ num_filters: 64 kernel: 5 pad: 2 }} {W}', (3, 32, 32), 16),
    pytest.param(f'name: "c" type: kCConvolution convolution_conf {{ num_filters: 128 kernel: 3 pad: 1 }} {W}',
                 (64, 7, 7), 8, marks=pytest.mark.slow),  # the Fourier route (seconds: scipy's first transforms)
    (f'name: "c" type: kCConvolution convolution_conf {{ num_filters: 16 kernel: 3 stride: 2 }} {W}', (8, 17, 17), 32),
    ('name: "p" type: kCPooling pooling_conf { pool: MAX kernel: 3 stride: 2 }', (32, 32, 32), 64),
    ('name: "p" type: kCPooling pooling_conf { pool: MAX kernel: 3 stride: 2 pad: 1 }', (32, 16, 16), 64),
    ('name: "p" type: kCPooling pooling_conf { pool: AVG kernel: 3 stride: 2 }', (32, 16, 16), 64),
    ('name: "n" type: kLRN lrn_conf { local_size: 3 alpha: 5e-05 beta: 0.75 }', (32, 16, 16), 64),
    ('name: "r" type: kReLU', (32, 16, 16), 64),
    ('name: "t" type: kSTanh', (2000,), 64),
    ('name: "s" type: kSigmoid', (2000,), 64),
]


def measured(layer, x):
    """(held, passing) bytes of ``layer`` on ``x``: held, what is still allocated after two forwards and
    backwards (the first pass makes the scratch arrays a layer keeps from step to step; the second's
    param gradients are not formed yet, as in a step before its update) besides the output and the
    gradients; passing, the most allocated at once inside the second forward or backward
    beyond what is allocated after it."""
    warm = build_layer(layer.conf, [x.shape[1:]], len(x), dtype=np.float32)  # first uses import modules
    warm.backward(np.ones_like(warm.forward([x], True)), [True])
    _form_gradients(warm)
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        y = layer.forward([x], True)
        grad = np.ones_like(y)
        layer.backward(grad, [True])
        del y
        _form_gradients(layer)
        gc.collect()
        tracemalloc.reset_peak()
        y = layer.forward([x], True)
        after_forward, peak = tracemalloc.get_traced_memory()
        forward = peak - after_forward
        tracemalloc.reset_peak()
        dx = layer.backward(grad, [True])[0]
        after_backward, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    held = after_backward - start - y.nbytes - grad.nbytes - dx.nbytes
    return held, max(forward, peak - after_backward)


def _form_gradients(layer) -> None:
    """Form the param gradients, as a step's update reads them: the pending products let go of their arrays."""
    for param in layer.params:
        assert param.grad is not None


@pytest.mark.parametrize("text, shape, rows", FAMILIES, ids=lambda value: value.split("type: ")[1].split()[0]
                         if isinstance(value, str) else str(value))
def test_a_layer_family_declares_what_it_allocates(text, shape, rows):
    layer = build_layer(text, [shape], rows, dtype=np.float32)
    x = np.random.default_rng(0).normal(0, 1, (rows,) + shape).astype(np.float32)
    held, passing = measured(layer, x)
    declared_held, declared_passing = layer_class_of(layer.conf).work_bytes(layer.conf, rows, shape, layer.out_shape)
    assert declared_held == pytest.approx(held, rel=0.10, abs=128 << 10), (declared_held, held)
    assert declared_passing == pytest.approx(passing, rel=0.25, abs=128 << 10), (declared_passing, passing)
