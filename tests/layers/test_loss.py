"""Loss layers: gradients against central differences of the total loss, metrics, partition sums."""
import numpy as np
import pytest

from gradcheck import build_layer
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LayerContext
from test_neuron import conf, rand


def total_loss(layer, inputs) -> float:
    layer.forward(inputs, True)
    return layer.metrics()["loss"] / layer.ctx.global_batch


def numeric_grad(layer, inputs, k, eps=1e-6):
    x = inputs[k]
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        plus = total_loss(layer, inputs)
        x[idx] = old - eps
        minus = total_loss(layer, inputs)
        x[idx] = old
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


def test_softmax_loss_gradient_and_values():
    layer = build_layer(conf('name: "l" type: kSoftmaxLoss softmaxloss_conf { topk: 2 }'), [(4,), ()], batch=3)
    scores, labels = rand(3, 4), np.array([0, 3, 1])
    layer.forward([scores, labels], True)
    analytic = layer.backward(None, [True, False])[0]
    metrics = layer.metrics()
    p = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    assert metrics["loss"] == pytest.approx(-np.log(p[[0, 1, 2], labels]).sum())
    ranks = (scores > scores[[0, 1, 2], labels][:, None]).sum(axis=1)
    assert metrics["accuracy"] == (ranks < 2).sum() and metrics["count"] == 3
    np.testing.assert_allclose(analytic, numeric_grad(layer, [scores, labels], 0), atol=1e-7)


def test_softmax_loss_scale():
    layer = build_layer(conf('name: "l" type: kSoftmaxLoss softmaxloss_conf { scale: 2.5 }'), [(3,), ()], batch=2)
    scores, labels = rand(2, 3), np.array([2, 0])
    layer.forward([scores, labels], True)
    analytic = layer.backward(None, [True, False])[0]
    layer.metrics()
    np.testing.assert_allclose(analytic, numeric_grad(layer, [scores, labels], 0), atol=1e-7)


def test_euclidean_loss_gradient():
    layer = build_layer(conf('name: "l" type: kEuclideanLoss'), [(5,), (5,)], batch=3)
    pred, target = rand(3, 5), rand(3, 5, seed=4)
    layer.forward([pred, target], True)
    grads = layer.backward(None, [True, True])
    assert layer.metrics()["loss"] == pytest.approx(0.5 * ((pred - target) ** 2).sum())
    np.testing.assert_allclose(grads[0], numeric_grad(layer, [pred, target], 0), atol=1e-7)
    np.testing.assert_allclose(grads[1], numeric_grad(layer, [pred, target], 1), atol=1e-7)


@pytest.mark.parametrize("kind,second", [("kSoftmaxLoss", "labels"), ("kEuclideanLoss", "target")])
def test_row_partitions_sum_to_the_whole_uneven(kind, second):
    scores = rand(5, 4)
    other = np.array([1, 0, 3, 3, 2]) if second == "labels" else rand(5, 4, seed=9)
    shapes = [(4,), () if second == "labels" else (4,)]
    whole = build_layer(conf(f'name: "l" type: {kind}'), shapes, batch=5)
    whole.forward([scores, other], True)
    full_grad = whole.backward(None, [True, False])[0]
    full_metrics = whole.metrics()
    sums = {}
    for rows in [(0, 3), (3, 5)]:
        part = build_layer(conf(f'name: "l" type: {kind}'), shapes, batch=5,
                           ctx=LayerContext(global_batch=5, seed=7, batch_slice=rows))
        r = slice(*rows)
        part.forward([scores[r], other[r]], True)
        np.testing.assert_allclose(part.backward(None, [True, False])[0], full_grad[r])
        for key, value in part.metrics().items():
            sums[key] = sums.get(key, 0) + value
    assert sums == pytest.approx(full_metrics)


def test_label_out_of_range_is_a_data_error():
    layer = build_layer(conf('name: "loss" type: kSoftmaxLoss'), [(3,), ()], batch=2)
    with pytest.raises(DataError, match=r"layer 'loss': label 7 outside 0..2"):
        layer.forward([rand(2, 3), np.array([1, 7])], True)
