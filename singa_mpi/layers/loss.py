"""Loss layers: the objective and its gradient; metrics as sums over this sub-layer's rows.

Both losses divide by the GLOBAL batch size (``ctx.global_batch``), so the
gradients of row-partitioned sub-layers add up to exactly the serial gradient
for any split, even or not.  (SINGA 0.x divided by the local batch and
averaged replicas on the server, which equals this only for even splits.)
"""
from __future__ import annotations

import numpy as np

from singa_mpi.errors import DataError
from singa_mpi.layers.base import Layer, LayerConfigError, register
from singa_mpi.layers.neuron import softmax


class _Loss(Layer):
    is_loss = True
    feature_partitionable = False
    num_srcs = (2, 2)

    def __init__(self, conf, ctx=None):
        super().__init__(conf, ctx)
        self.sums: dict[str, float] = {}

    def _add(self, **values: float) -> None:
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value)

    def metrics(self) -> dict[str, float]:
        sums, self.sums = self.sums, {}
        return sums


@register("kSoftmaxLoss", "kCudnnSoftmaxLoss")
class SoftmaxLoss(_Loss):
    """Cross-entropy of softmax(scores) against integer labels (srclayers: scores, label source).

    Output: the probabilities.  Metrics: loss (Σ -log p[label] · scale), accuracy
    (rows whose label is among the ``topk`` highest scores), count (rows).
    """

    input_kinds = ("data", "aux")

    def setup(self, src_shapes):
        conf = self.conf.softmaxloss_conf
        self.classes = int(np.prod(src_shapes[0]))
        if conf.topk < 1 or conf.topk > self.classes:
            raise LayerConfigError("softmaxloss_conf.topk", conf.topk, f"1..{self.classes} (the number of classes)")
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        scores = inputs[0].reshape(len(inputs[0]), -1)
        labels = np.asarray(inputs[1]).astype(np.int64).reshape(-1)
        if labels.size and (labels.min() < 0 or labels.max() >= self.classes):
            bad = labels[(labels < 0) | (labels >= self.classes)][0]
            raise DataError(f"layer '{self.name}': label {bad} outside 0..{self.classes - 1} "
                            f"({self.classes} classes)")
        self.p, self.labels = softmax(scores), labels
        rows = np.arange(len(labels))
        picked = np.maximum(self.p[rows, labels], np.finfo(self.p.dtype).tiny)
        topk = self.conf.softmaxloss_conf.topk
        if topk == 1:
            hits = scores.argmax(axis=1) == labels
        else:
            hits = (scores > scores[rows, labels][:, None]).sum(axis=1) < topk
        scale = self.conf.softmaxloss_conf.scale
        self._add(loss=-np.log(picked).sum() * scale, accuracy=hits.sum(), count=len(labels))
        return self.p.reshape(inputs[0].shape)

    def backward(self, grad, need):
        d = self.p.copy()
        d[np.arange(len(self.labels)), self.labels] -= 1
        d *= d.dtype.type(self.conf.softmaxloss_conf.scale / self.ctx.global_batch)
        return [d.reshape(self.p.shape) if need[0] else None, None]


@register("kEuclideanLoss")
class EuclideanLoss(_Loss):
    """0.5·||prediction - target||² per row (srclayers: prediction, target; both data).

    Metric loss: Σ over rows of 0.5·||d||²; gradient d / global_batch to the
    prediction and -d / global_batch to the target.
    """

    def setup(self, src_shapes):
        if int(np.prod(src_shapes[0])) != int(np.prod(src_shapes[1])):
            raise LayerConfigError("srclayers", f"shapes {tuple(src_shapes[0])} and {tuple(src_shapes[1])}",
                                   "a prediction and a target of the same size")
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        pred = inputs[0]
        self.d = pred.reshape(len(pred), -1) - inputs[1].reshape(len(pred), -1)
        self._add(loss=0.5 * float((self.d * self.d).sum()), count=len(pred))
        return pred

    def backward(self, grad, need):
        g = self.d * self.d.dtype.type(1.0 / self.ctx.global_batch)
        shape = (len(g),) + self.out_shape
        return [g.reshape(shape) if need[0] else None, (-g).reshape(shape) if need[1] else None]
