"""Numerical gradient check for layers (central differences, float64).

Usage in a test::

    layer = build_layer(conf, [(3, 8, 8)], batch=4)      # setup + float64 params
    check_layer_gradients(layer, [x])                     # raises AssertionError on mismatch
"""
from __future__ import annotations

import numpy as np

from singa_mpi.layers.base import Layer, LayerContext, layer_class
from singa_mpi.params import Param, logical_init
from singa_mpi.proto import job_pb2


def build_layer(conf: job_pb2.LayerProto, src_shapes, batch: int, seed: int = 7,
                ctx: LayerContext | None = None, dtype=np.float64) -> Layer:
    """Instantiate, set up and allocate params (in ``dtype``) for a stand-alone layer."""
    cls = layer_class(job_pb2.LayerType.Name(conf.type))
    ctx = ctx or LayerContext(global_batch=batch, seed=seed)
    layer = cls(conf, ctx)
    layer.out_shape = layer.setup([tuple(s) for s in src_shapes])
    for spec in layer.param_specs:
        param = Param(spec.conf, spec.logical_shape, spec.shard)
        value = logical_init(spec.conf, spec.logical_shape, seed)[param.shard_index()]
        param.data = value.astype(dtype)
        param.grad = np.zeros_like(param.data)
        layer.params.append(param)
    return layer


def _loss(layer: Layer, inputs, weights, train: bool) -> float:
    out = layer.forward([x.copy() for x in inputs], train)
    return float(np.sum(out * weights))


def check_layer_gradients(layer: Layer, inputs: list[np.ndarray], check_inputs=None, train: bool = True,
                          eps: float = 1e-6, rtol: float = 1e-4, atol: float = 1e-7,
                          max_entries: int = 60, seed: int = 0) -> None:
    """Compare backward() with central differences of sum(forward(x) * R).

    check_inputs: indices of inputs whose gradient is checked (default: all float inputs).
    Randomness inside forward (dropout) must be keyed by step, not by call count, so
    repeated forwards in one step see the same mask.
    """
    rng = np.random.default_rng(seed)
    if check_inputs is None:
        check_inputs = [i for i, x in enumerate(inputs) if np.issubdtype(x.dtype, np.floating)]
    out = layer.forward([x.copy() for x in inputs], train)
    weights = rng.standard_normal(out.shape)
    for p in layer.params:
        p.grad[...] = 0
    need = [i in check_inputs for i in range(len(inputs))]
    grads = layer.backward(weights.astype(out.dtype), need)

    def numeric(array: np.ndarray, index) -> float:
        old = array[index]
        array[index] = old + eps
        plus = _loss(layer, inputs, weights, train)
        array[index] = old - eps
        minus = _loss(layer, inputs, weights, train)
        array[index] = old
        return (plus - minus) / (2 * eps)

    def compare(what: str, array: np.ndarray, analytic: np.ndarray) -> None:
        assert analytic is not None, f"{what}: backward returned no gradient"
        assert analytic.shape == array.shape, f"{what}: grad shape {analytic.shape} != {array.shape}"
        flat = list(np.ndindex(array.shape))
        picks = rng.choice(len(flat), size=min(max_entries, len(flat)), replace=False)
        for k in picks:
            idx = flat[k]
            num = numeric(array, idx)
            ana = float(analytic[idx])
            assert abs(num - ana) <= atol + rtol * max(abs(num), abs(ana)), \
                f"{what}{list(idx)}: numerical {num:.8g} != analytic {ana:.8g}"

    for i in check_inputs:
        compare(f"input[{i}]", inputs[i], grads[i])
    for p in layer.params:
        compare(f"param {p.name}", p.data, p.grad.copy())
