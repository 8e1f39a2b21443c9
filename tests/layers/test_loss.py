"""Loss layers: values by hand, gradients against central differences of the total loss,
top-k accuracy, and row partitions (even and uneven) that add up to the whole batch.

The objective of a loss layer is J = (metric "loss" summed over rows) / global_batch;
backward() must be dJ/d(input) for every sub-layer of any row split.
"""
import math

import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.testing import build_layer
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LayerConfigError, LayerContext, layer_class
from singa_mpi.layers.loss import EuclideanLoss, SoftmaxLoss
from singa_mpi.proto import job_pb2


def layer_conf(text: str) -> job_pb2.LayerProto:
    return text_format.Parse(text, job_pb2.LayerProto())


def softmax_loss(batch: int, classes=4, extra="", rows=None, feature_shape=None):
    ctx = LayerContext(global_batch=batch, batch_slice=rows)
    return build_layer(layer_conf(f'name: "loss" type: kSoftmaxLoss {extra}'),
                       [feature_shape or (classes,), ()], batch=batch, ctx=ctx)


def euclidean_loss(batch: int, pred_shape=(5,), target_shape=None, rows=None):
    ctx = LayerContext(global_batch=batch, batch_slice=rows)
    return build_layer(layer_conf('name: "rec" type: kEuclideanLoss'),
                       [pred_shape, target_shape or pred_shape], batch=batch, ctx=ctx)


def normal(*shape, seed=0):
    return np.random.default_rng(seed).normal(0, 1, shape)


def objective(layer, inputs) -> float:
    """J = Σ_rows loss / global_batch: the function backward() differentiates."""
    layer.forward([x.copy() for x in inputs], True)
    return layer.metrics()["loss"] / layer.ctx.global_batch


def numeric_gradient(layer, inputs, k, eps=1e-6) -> np.ndarray:
    """Central differences of the objective w.r.t. inputs[k], every entry (inputs are tiny)."""
    x = inputs[k]
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        plus = objective(layer, inputs)
        x[idx] = old - eps
        minus = objective(layer, inputs)
        x[idx] = old
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


# ------------------------------------------------------------- softmax loss

def test_losses_declare_whole_row_two_source_layers():
    assert layer_class("kSoftmaxLoss") is SoftmaxLoss and layer_class("kCudnnSoftmaxLoss") is SoftmaxLoss
    assert layer_class("kEuclideanLoss") is EuclideanLoss
    for cls in (SoftmaxLoss, EuclideanLoss):
        assert cls.is_loss and not cls.feature_partitionable and cls.num_srcs == (2, 2)
    assert SoftmaxLoss.input_kinds == ("data", "aux")
    assert EuclideanLoss.input_kinds in ((), ("data", "data"))


def test_softmax_loss_values_by_hand():
    layer = softmax_loss(batch=2, classes=3)
    # row 0: exp(scores) = 1, 2, 5 -> p = 1/8, 2/8, 5/8; row 1: all equal -> p = 1/3
    scores = np.array([[0.0, math.log(2), math.log(5)], [7.0, 7.0, 7.0]])
    p = layer.forward([scores, np.array([1, 2])], True)
    np.testing.assert_allclose(p, [[1 / 8, 2 / 8, 5 / 8], [1 / 3, 1 / 3, 1 / 3]])
    grad = layer.backward(None, [True, False])
    np.testing.assert_allclose(grad[0], [[1 / 16, (2 / 8 - 1) / 2, 5 / 16], [1 / 6, 1 / 6, (1 / 3 - 1) / 2]])
    assert grad[1] is None
    metrics = layer.metrics()
    assert metrics["loss"] == pytest.approx(math.log(4) + math.log(3))
    # row 0's label 1 is not the argmax (2); row 1 ties: the lowest index (0) wins, label 2 misses
    assert metrics == {"loss": metrics["loss"], "loss/count": 2.0, "accuracy": 0.0, "accuracy/count": 2.0}


@pytest.mark.parametrize("extra", ["", "softmaxloss_conf { scale: 2.5 }", "softmaxloss_conf { topk: 3 }"])
def test_softmax_loss_gradient_matches_central_differences(extra):
    layer = softmax_loss(batch=3, classes=4, extra=extra)
    scores, labels = normal(3, 4), np.array([0, 3, 1])
    layer.forward([scores.copy(), labels], True)
    analytic = layer.backward(None, [True, False])[0]
    layer.metrics()
    np.testing.assert_allclose(analytic, numeric_gradient(layer, [scores, labels], 0), rtol=1e-6, atol=1e-9)


def test_softmax_loss_scale_multiplies_loss_and_gradient():
    plain, scaled = softmax_loss(batch=2, classes=3), softmax_loss(batch=2, classes=3,
                                                                   extra="softmaxloss_conf { scale: 0.5 }")
    scores, labels = normal(2, 3), np.array([2, 0])
    for layer in (plain, scaled):
        layer.forward([scores, labels], True)
    np.testing.assert_allclose(scaled.backward(None, [True, False])[0],
                               0.5 * plain.backward(None, [True, False])[0])
    assert scaled.metrics()["loss"] == pytest.approx(0.5 * plain.metrics()["loss"])


def test_softmax_loss_flattens_multi_dimensional_scores_and_keeps_their_shape():
    layer = softmax_loss(batch=2, feature_shape=(2, 3))
    scores, labels = normal(2, 2, 3), np.array([5, 0])
    p = layer.forward([scores.copy(), labels], True)
    assert p.shape == (2, 2, 3)
    np.testing.assert_allclose(p.reshape(2, 6).sum(axis=1), 1.0)
    grad = layer.backward(None, [True, False])[0]
    assert grad.shape == (2, 2, 3)
    layer.metrics()
    np.testing.assert_allclose(grad, numeric_gradient(layer, [scores, labels], 0), rtol=1e-6, atol=1e-9)


def test_softmax_loss_is_stable_for_huge_scores_and_keeps_float32():
    layer = softmax_loss(batch=2, classes=3)
    scores = np.array([[1e4, 0.0, -1e4], [-3e4, 3e4, 0.0]], np.float32)
    p = layer.forward([scores, np.array([2, 1], np.int32)], True)
    grad = layer.backward(None, [True, False])[0]
    assert p.dtype == np.float32 and grad.dtype == np.float32
    assert np.isfinite(p).all() and np.isfinite(grad).all()
    # row 0's label has p = e^-20000: the log-softmax gives the exact loss 20000, row 1's is 0
    assert layer.metrics()["loss"] == pytest.approx(2e4, rel=1e-6)


def test_top_k_accuracy_counts_labels_among_the_k_highest_scores():
    scores = np.array([
        [0.1, 0.9, 0.5, 0.3],  # order 1, 2, 3, 0
        [0.4, 0.4, 0.1, 0.0],  # tie between 0 and 1: class 0 ranks first
        [0.0, 0.2, 0.3, 0.1],  # order 2, 1, 3, 0
    ])
    labels = np.array([3, 1, 0])  # label ranks: 2, 1, 3
    hits = {}
    for k in (1, 2, 3, 4):
        layer = softmax_loss(batch=3, extra=f"softmaxloss_conf {{ topk: {k} }}")
        layer.forward([scores, labels], True)
        hits[k] = layer.metrics()["accuracy"]
    assert hits == {1: 0.0, 2: 1.0, 3: 2.0, 4: 3.0}


def test_top_1_accuracy_is_argmax_accuracy():
    scores = np.round(normal(50, 6, seed=3), 1)  # rounding makes ties
    labels = np.random.default_rng(4).integers(0, 6, 50)
    layer = softmax_loss(batch=50, classes=6)
    layer.forward([scores, labels], True)
    assert layer.metrics()["accuracy"] == (scores.argmax(axis=1) == labels).sum()


def test_metrics_are_sums_since_the_last_call_and_reset():
    layer = softmax_loss(batch=2, classes=3)
    scores, labels = normal(2, 3), np.array([0, 1])
    layer.forward([scores, labels], True)
    once = layer.metrics()
    layer.forward([scores, labels], True)
    layer.forward([scores, labels], True)
    twice = layer.metrics()
    assert twice["loss/count"] == twice["accuracy/count"] == 4 and twice["loss"] == pytest.approx(2 * once["loss"])
    assert twice["accuracy"] == 2 * once["accuracy"]
    assert layer.metrics() == {"loss": 0.0, "loss/count": 0.0, "accuracy": 0.0, "accuracy/count": 0.0}


@pytest.mark.parametrize("labels, message", [
    (np.array([1, 7]), "layer 'loss': label 7: expected a class index in 0..3 (4 classes)"),
    (np.array([-1, 0]), "layer 'loss': label -1: expected a class index in 0..3 (4 classes)"),
    (np.array([1.0, 2.5]), "layer 'loss': label 2.5: expected an integer class index"),
    (np.array([1, 2, 3]), "layer 'loss': 3 labels for 2 rows of scores"),
])
def test_bad_labels_are_data_errors_naming_the_layer(labels, message):
    layer = softmax_loss(batch=2)
    with pytest.raises(DataError) as err:
        layer.forward([normal(2, 4), labels], True)
    assert message in str(err.value)


def test_integral_float_labels_are_accepted():
    layer = softmax_loss(batch=2)
    layer.forward([normal(2, 4), np.array([3.0, 0.0], np.float32)], True)
    assert layer.metrics()["loss/count"] == 2


@pytest.mark.parametrize("topk", [0, 5])
def test_topk_outside_the_classes_is_a_config_error(topk):
    with pytest.raises(LayerConfigError, match=rf"softmaxloss_conf.topk = {topk}: expected 1..4"):
        softmax_loss(batch=2, extra=f"softmaxloss_conf {{ topk: {topk} }}")


def test_a_negative_scale_is_a_config_error_it_would_climb_the_loss():
    """scale: -1 was taken: the gradient (p - onehot)·scale / B then pointed up the loss, so every step
    raised it (the loss reported negative), as a negative learning rate would; 0 is taken (as base_lr 0)."""
    with pytest.raises(LayerConfigError, match=r"softmaxloss_conf.scale = -1(\.0)?: expected a value >= 0"):
        softmax_loss(batch=2, extra="softmaxloss_conf { scale: -1 }")
    softmax_loss(batch=2, extra="softmaxloss_conf { scale: 0 }")


# ----------------------------------------------------------- euclidean loss

def test_euclidean_loss_values_by_hand():
    layer = euclidean_loss(batch=2, pred_shape=(2,))
    pred, target = np.array([[1.0, 2.0], [0.5, 0.5]]), np.array([[0.0, 0.0], [0.5, -0.5]])
    out = layer.forward([pred, target], True)
    np.testing.assert_array_equal(out, pred)
    grads = layer.backward(None, [True, True])
    np.testing.assert_allclose(grads[0], [[0.5, 1.0], [0.0, 0.5]])  # (pred - target) / 2
    np.testing.assert_allclose(grads[1], -grads[0])
    assert layer.metrics() == {"loss": pytest.approx(0.5 * 5 + 0.5 * 1), "loss/count": 2.0}


def test_euclidean_loss_gradients_match_central_differences():
    layer = euclidean_loss(batch=3)
    pred, target = normal(3, 5), normal(3, 5, seed=4)
    layer.forward([pred.copy(), target.copy()], True)
    grads = layer.backward(None, [True, True])
    layer.metrics()
    np.testing.assert_allclose(grads[0], numeric_gradient(layer, [pred, target], 0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(grads[1], numeric_gradient(layer, [pred, target], 1), rtol=1e-6, atol=1e-9)


def test_euclidean_loss_target_gets_no_gradient_unless_needed():
    layer = euclidean_loss(batch=2)
    layer.forward([normal(2, 5), normal(2, 5, seed=1)], True)
    grads = layer.backward(None, [True, False])
    assert grads[0] is not None and grads[1] is None


def test_euclidean_loss_accepts_a_target_of_another_shape_and_the_same_size():
    layer = euclidean_loss(batch=2, pred_shape=(6,), target_shape=(1, 2, 3))
    pred, target = normal(2, 6), normal(2, 1, 2, 3, seed=2)
    layer.forward([pred, target], True)
    grads = layer.backward(None, [True, True])
    assert grads[0].shape == (2, 6) and grads[1].shape == (2, 1, 2, 3)
    np.testing.assert_allclose(grads[0], (pred - target.reshape(2, 6)) / 2)


def test_euclidean_loss_refuses_sizes_that_differ():
    with pytest.raises(LayerConfigError, match=r"srclayers = shapes \(5,\) and \(4,\)"):
        euclidean_loss(batch=2, pred_shape=(5,), target_shape=(4,))


def test_euclidean_loss_keeps_float32():
    layer = euclidean_loss(batch=2)
    pred, target = normal(2, 5).astype(np.float32), normal(2, 5, seed=1).astype(np.float32)
    layer.forward([pred, target], True)
    assert all(g.dtype == np.float32 for g in layer.backward(None, [True, True]))


# -------------------------------------------------------- row partitioning

def whole_and_parts(make, inputs, batch, splits):
    """Run the whole batch, then each row slice in its own sub-layer; return both results."""
    whole = make(batch, rows=None)
    whole.forward(inputs, True)
    whole_grad = whole.backward(None, [True, False])[0]
    parts = []
    for lo, hi in splits:
        part = make(batch, rows=(lo, hi))
        part.forward([x[lo:hi] for x in inputs], True)
        parts.append((part.backward(None, [True, False])[0], part.metrics()))
    return whole_grad, whole.metrics(), parts


@pytest.mark.parametrize("batch, splits", [(4, [(0, 2), (2, 4)]), (5, [(0, 3), (3, 5)]),
                                           (5, [(0, 2), (2, 4), (4, 5)])])
@pytest.mark.parametrize("kind", ["softmax", "euclidean"])
def test_row_partitions_give_the_rows_of_the_whole_gradient_and_metrics_that_add_up(kind, batch, splits):
    if kind == "softmax":
        def make(b, rows):
            return softmax_loss(b, classes=4, extra="softmaxloss_conf { topk: 2 }", rows=rows)
        inputs = [normal(batch, 4), np.random.default_rng(1).integers(0, 4, batch)]
    else:
        def make(b, rows):
            return euclidean_loss(b, pred_shape=(4,), rows=rows)
        inputs = [normal(batch, 4), normal(batch, 4, seed=1)]
    whole_grad, whole_metrics, parts = whole_and_parts(make, inputs, batch, splits)
    # the same numbers, not merely close: each row's gradient is computed identically
    np.testing.assert_array_equal(np.concatenate([grad for grad, _ in parts]), whole_grad)
    totals = {key: sum(metrics[key] for _, metrics in parts) for key in whole_metrics}
    assert totals == pytest.approx(whole_metrics, rel=1e-12)
    assert totals["loss/count"] == batch


def test_dividing_by_the_local_batch_would_not_add_up_for_uneven_splits():
    # why the layers use ctx.global_batch: SINGA's per-replica mean, averaged over the
    # two replicas of a 3 + 2 split, weights the rows 1/6 and 1/4 instead of 1/5
    scores, labels = normal(5, 4), np.array([0, 1, 2, 3, 0])
    whole = softmax_loss(5)
    whole.forward([scores, labels], True)
    serial = whole.backward(None, [True, False])[0]
    averaged = []
    for lo, hi in [(0, 3), (3, 5)]:
        local = softmax_loss(hi - lo)  # a sub-layer that believes its rows are the batch
        local.forward([scores[lo:hi], labels[lo:hi]], True)
        averaged.append(local.backward(None, [True, False])[0] / 2)
    assert not np.allclose(np.concatenate(averaged), serial)
