"""Loss layers: the objective, its gradient, and metrics summed over this sub-layer's rows.

Both losses divide gradients by the GLOBAL batch size (``ctx.global_batch``),
so the gradients of row-partitioned sub-layers are exactly the rows of the
serial gradient, for any split, even or not.  (SINGA 0.x divided by the local
batch and the server averaged the replicas' gradients, which equals this only
when every replica has the same number of rows.)

``metrics()`` returns, for each metric ``k``, its sum over the rows seen since
the last call and the number of those rows as ``k/count``, and resets them; the
trainer adds both over all sub-layers (and ranks) and divides each sum by its
own count, giving SINGA's per-row averages (as SINGA's ``Metric`` keeps a
(sum, count) pair per name).
"""
from __future__ import annotations

import math

import numpy as np

from singa_mpi.errors import DataError
from singa_mpi.layers.base import LAYERS, Layer, LayerConfigError, sum_over_rows


class _Loss(Layer):
    """Shared by the losses: whole rows only, two sources, running metric sums."""

    deterministic = True  # row by row: any split of the batch gives the same bits

    is_loss = True
    feature_partitionable = False
    num_srcs = (2, 2)
    metric_names: tuple[str, ...] = ("loss",)

    def __init__(self, conf, ctx=None):
        super().__init__(conf, ctx)
        self._reset_sums()

    def _reset_sums(self) -> None:
        self.sums = {key: 0.0 for key in self.metric_names}
        self.rows = 0

    def metrics(self) -> dict[str, float]:
        """{k: sum over rows, "k/count": rows} for each metric since the last call (in deterministic
        mode also its per-block sums, ``k@b``); resets."""
        out = dict(self.sums)
        for key in self.metric_names:
            out[f"{key}/count"] = float(self.rows)
        self._reset_sums()
        return out


def _check_labels(layer: str, labels: np.ndarray, rows: int, classes: int) -> np.ndarray:
    """Labels as int64 of shape (rows,); DataError naming the layer for anything else."""
    labels = np.asarray(labels).reshape(-1)
    if len(labels) != rows:
        raise DataError(f"layer '{layer}': {len(labels)} labels for {rows} rows of scores: "
                        f"expected one label per row")
    if not np.issubdtype(labels.dtype, np.integer):
        if np.any(labels != np.round(labels)):
            bad = labels[labels != np.round(labels)][0]
            raise DataError(f"layer '{layer}': label {bad}: expected an integer class index")
        labels = labels.astype(np.int64)
    row = first_label_outside(labels, classes)
    if row is not None:
        raise DataError(f"layer '{layer}': label {labels[row]}: expected a class index in "
                        f"0..{classes - 1} ({classes} classes)")
    return labels.astype(np.int64, copy=False)


def first_label_outside(labels: np.ndarray, classes: int) -> int | None:
    """The first row whose label is no class index 0..classes-1 (a fraction included), else None."""
    outside = np.flatnonzero((labels < 0) | (labels >= classes) | (labels != np.round(labels)))
    return int(outside[0]) if outside.size else None


def _ranks_of_labels(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Position of each row's label when the row is sorted by descending score.  # (rows,)

    Ties go to the lower class index (like ``argmax``), so topk 1 is argmax accuracy.
    """
    rows = np.arange(len(labels))
    label_scores = scores[rows, labels][:, None]
    classes = np.arange(scores.shape[1])[None, :]
    before = (scores > label_scores) | ((scores == label_scores) & (classes < labels[:, None]))
    return before.sum(axis=1)


@LAYERS.register("kSoftmaxLoss", "kCudnnSoftmaxLoss")
class SoftmaxLoss(_Loss):
    """Cross-entropy of softmax(scores) against integer labels.

    srclayers: [scores (rows, ...) flattened to classes, label source (its int labels)].
    Output: the probabilities, in the scores' shape.  Metrics (sums over rows):
    loss = Σ -log p[label]·scale, accuracy = rows whose label is among the
    ``topk`` highest scores, each with its count of rows.  Gradient to the scores:
    (p - onehot(label))·scale / global_batch.

    -log p[label] is computed from the log-softmax, so it stays exact where p
    underflows; SINGA clamps p at FLT_MIN, capping a row's loss at 87.3.
    """

    input_kinds = ("data", "aux")
    metric_names = ("loss", "accuracy")
    per_batch = ("p", "labels")

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Held: the probabilities; passing: the shifted scores and their exponentials."""
        size = 4 * rows * math.prod(in_shape)
        return size, 2 * size

    def setup(self, src_shapes):
        conf = self.conf.softmaxloss_conf
        self.classes = int(np.prod(src_shapes[0]))
        if not 1 <= conf.topk <= self.classes:
            raise LayerConfigError("softmaxloss_conf.topk", conf.topk, f"1..{self.classes} (the number of classes)")
        if conf.scale < 0:  # a sign slip: its gradient would point up the loss, as a negative learning rate's
            raise LayerConfigError("softmaxloss_conf.scale", conf.scale, "a value >= 0 (it multiplies the loss and "
                                   "its gradient; default 1)")
        self.topk, self.scale = conf.topk, conf.scale
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        scores = inputs[0].reshape(len(inputs[0]), -1)  # (rows, classes)
        labels = _check_labels(self.name, inputs[1], len(scores), self.classes)
        shifted = scores - scores.max(axis=1, keepdims=True)
        exp = np.exp(shifted)
        total = exp.sum(axis=1, keepdims=True)
        self.p = exp / total
        self.labels = labels
        rows = np.arange(len(labels))
        neg_log_p = np.log(total[:, 0]) - shifted[rows, labels]
        sum_over_rows(self.ctx, self.sums, "loss", len(labels),
                      lambda lo, hi: float(neg_log_p[lo:hi].sum()) * self.scale)
        self.sums["accuracy"] += float((_ranks_of_labels(scores, labels) < self.topk).sum())
        self.rows += len(labels)
        return self.p.reshape(inputs[0].shape)

    def backward(self, grad, need):
        if not need[0]:
            return [None, None]
        d = self.p.copy()  # (rows, classes)
        d[np.arange(len(self.labels)), self.labels] -= 1
        d *= self.scale / self.ctx.global_batch
        return [d.reshape((len(d),) + self.out_shape), None]


@LAYERS.register("kEuclideanLoss")
class EuclideanLoss(_Loss):
    """Squared error: loss = Σ_rows ½·||prediction - target||² / global_batch.

    srclayers: [prediction, target], both data, of the same size per row.
    Output: the prediction.  Metrics (sums over rows): loss = Σ ½·||d||²,
    with its count of rows.  Gradient: d / global_batch to the prediction, -d / global_batch
    to the target (only when it needs one), with d = prediction - target.

    SINGA 0.2/0.3 used the same gradient, d / batch, but displayed
    Σ||d||² / batch, twice this loss (v0.1 used 2·d / batch as the gradient).
    Here the reported loss is the objective whose gradient is computed.
    """

    per_batch = ("d",)

    def setup(self, src_shapes):
        if int(np.prod(src_shapes[0])) != int(np.prod(src_shapes[1])):
            raise LayerConfigError("srclayers", f"shapes {tuple(src_shapes[0])} and {tuple(src_shapes[1])}",
                                   "a prediction and a target of the same size")
        self.target_shape = tuple(src_shapes[1])
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        prediction, target = inputs
        self.d = prediction.reshape(len(prediction), -1) - target.reshape(len(target), -1)  # (rows, dim)
        d = self.d
        sum_over_rows(self.ctx, self.sums, "loss", len(d),
                      lambda lo, hi: 0.5 * float(np.einsum("ij,ij->", d[lo:hi], d[lo:hi])))
        self.rows += len(prediction)
        return prediction

    def backward(self, grad, need):
        g = self.d * (1.0 / self.ctx.global_batch)  # (rows, dim)
        rows = len(g)
        return [g.reshape((rows,) + self.out_shape) if need[0] else None,
                (-g).reshape((rows,) + self.target_shape) if need[1] else None]
