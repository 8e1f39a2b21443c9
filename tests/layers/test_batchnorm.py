"""Batch normalization: gradients, a float64 reference, running statistics, statistics over split rows."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.testing import build_layer, check_layer_gradients
from singa_mpi.communication.local import run_ranks
from singa_mpi.layers.base import LayerConfigError, LayerContext
from singa_mpi.planner.chunk import chunk
from singa_mpi.proto import job_pb2

PARAMS = ('param { name: "s" init { type: kGaussian mean: 1 std: 0.2 } } '
          'param { name: "b" init { type: kGaussian std: 0.2 } } '
          'param { name: "m" init { type: kConstant value: 0 } } param { name: "v" init { type: kConstant value: 1 } }')


def conf(extra: str = "", kind: str = "kCudnnBM") -> job_pb2.LayerProto:
    layer = job_pb2.LayerProto()
    text_format.Parse(f'name: "bm" type: {kind} {extra} {PARAMS}', layer)
    return layer


def reference(x, gamma, beta, grad, eps=1e-5):
    """Textbook batch norm over every axis but 1, in float64: (y, dx, dgamma, dbeta)."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    n = x.size / x.shape[1]
    mean, var = x.mean(axes), x.var(axes)
    x_hat = (x - mean.reshape(shape)) / np.sqrt(var + eps).reshape(shape)
    y = gamma.reshape(shape) * x_hat + beta.reshape(shape)
    dbeta, dgamma = grad.sum(axes), (grad * x_hat).sum(axes)
    dx = (gamma / np.sqrt(var + eps) / n).reshape(shape) * (n * grad - dbeta.reshape(shape)
                                                            - x_hat * dgamma.reshape(shape))
    return y, dx, dgamma, dbeta


@pytest.mark.parametrize("shape", [(3, 4, 5), (6,)])
def test_gradients(shape):
    layer = build_layer(conf(), [shape], batch=4)
    x = np.random.default_rng(0).normal(2, 3, (4, *shape))
    check_layer_gradients(layer, [x])


@pytest.mark.parametrize("shape", [(3, 4, 5), (6,)])
def test_matches_a_float64_reference(shape):
    layer = build_layer(conf(), [shape], batch=5)
    rng = np.random.default_rng(1)
    x, grad = rng.normal(-1, 2, (5, *shape)), rng.normal(0, 1, (5, *shape))
    gamma, beta = (p.data.reshape(-1) for p in layer.params[:2])
    y_ref, dx_ref, dgamma, dbeta = reference(x, gamma, beta, grad)
    np.testing.assert_allclose(layer.forward([x], True), y_ref, rtol=1e-10, atol=1e-12)
    for p in layer.params:
        p.zero_grad()
    (dx,) = layer.backward(grad, [True])
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(layer.params[0].grad.reshape(-1), dgamma, rtol=1e-10)
    np.testing.assert_allclose(layer.params[1].grad.reshape(-1), dbeta, rtol=1e-10)
    assert layer.params[0].data.shape == ((1, shape[0], 1, 1) if len(shape) == 3 else (1, shape[0]))


def test_running_statistics_are_used_at_test_time():
    layer = build_layer(conf("bm_conf { running_factor: 0.5 }"), [(2,)], batch=4)
    x = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])
    layer.forward([x], True)
    mean, var = layer.params[2].data.reshape(-1), layer.params[3].data.reshape(-1)
    np.testing.assert_allclose(mean, 0.5 * x.mean(0))  # from 0 halfway to the batch mean
    np.testing.assert_allclose(var, 0.5 * 1 + 0.5 * x.var(0, ddof=1))  # the unbiased variance
    gamma, beta = (p.data.reshape(-1) for p in layer.params[:2])
    y = layer.forward([x], False)
    np.testing.assert_allclose(y, gamma * (x - mean) / np.sqrt(var + 1e-5) + beta)
    np.testing.assert_allclose(layer.params[2].data.reshape(-1), mean)  # testing leaves them alone


@pytest.mark.parametrize("workers", [2, 3])
def test_rows_split_over_workers_normalise_with_the_whole_batch(workers):
    """Each worker holds some rows; sums go through the group: outputs and gradients are the serial ones."""
    batch, shape = 7, (2, 3, 3)
    rng = np.random.default_rng(2)
    x, grad = rng.normal(1, 2, (batch, *shape)), rng.normal(0, 1, (batch, *shape))
    whole = build_layer(conf(), [shape], batch=batch)
    y_want = whole.forward([x], True)
    for p in whole.params:
        p.zero_grad()
    (dx_want,) = whole.backward(grad, [True])

    def worker(comm):
        lo, hi = chunk(batch, comm.size, comm.rank)

        def allreduce(array):
            total = np.ascontiguousarray(array, np.float64)
            comm.Allreduce(total, "bm")
            return total
        ctx = LayerContext(global_batch=batch, batch_slice=(lo, hi), seed=7, allreduce=allreduce)
        part = build_layer(conf(), [shape], batch=batch, ctx=ctx)
        y = part.forward([x[lo:hi]], True)
        for p in part.params:
            p.zero_grad()
        (dx,) = part.backward(grad[lo:hi], [True])
        return lo, hi, y, dx, part.params[0].grad.copy(), part.params[2].data.copy()

    results = run_ranks(workers, worker, timeout=60)
    dgamma = sum(r[4] for r in results)
    for lo, hi, y, dx, _, running_mean in results:
        np.testing.assert_allclose(y, y_want[lo:hi], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dx, dx_want[lo:hi], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(running_mean, whole.params[2].data, rtol=1e-12)
    np.testing.assert_allclose(dgamma, whole.params[0].grad, rtol=1e-10)  # the param sync sums the shares


@pytest.mark.parametrize("extra,field", [("bm_conf { running_factor: 0 }", "bm_conf.running_factor"),
                                         ("bm_conf { epsilon: -1 }", "bm_conf.epsilon")])
def test_bad_configuration(extra, field):
    with pytest.raises(LayerConfigError) as info:
        build_layer(conf(extra), [(3,)], batch=4)
    assert info.value.field == field


def test_one_value_per_channel_cannot_be_normalised():
    with pytest.raises(LayerConfigError, match="at least 2 values per channel"):
        build_layer(conf(), [(3,)], batch=1)
