"""Output layers: accuracy, top-k indices, and writing features to CSV or kvfile stores.

Output layers see whole rows; writers must see the whole batch, so they refuse
partitioning on features and should run unpartitioned (partition_dim: -1).
"""
from __future__ import annotations

import os

import numpy as np

from singa_mpi.data.stores import KVFileWriter
from singa_mpi.layers.base import Layer, LayerConfigError, register
from singa_mpi.proto import job_pb2


@register("kAccuracy")
class Accuracy(Layer):
    """Top-1 accuracy of predictions against labels (srclayers: predictions, label source)."""

    input_kinds = ("data", "aux")
    num_srcs = (2, 2)
    feature_partitionable = False

    def setup(self, src_shapes):
        self.sums = {"accuracy": 0.0, "count": 0.0}
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        scores = inputs[0].reshape(len(inputs[0]), -1)
        labels = np.asarray(inputs[1]).reshape(-1)
        self.sums["accuracy"] += float((scores.argmax(axis=1) == labels).sum())
        self.sums["count"] += len(labels)
        return inputs[0]

    def metrics(self):
        sums, self.sums = self.sums, {"accuracy": 0.0, "count": 0.0}
        return sums if sums["count"] else {}


@register("kArgSort")
class ArgSort(Layer):
    """Indices of the ``topk`` largest scores per row, largest first (as floats)."""

    feature_partitionable = False

    def setup(self, src_shapes):
        self.topk = self.conf.argsort_conf.topk
        classes = int(np.prod(src_shapes[0]))
        if not 1 <= self.topk <= classes:
            raise LayerConfigError("argsort_conf.topk", self.topk, f"1..{classes}")
        return (self.topk,)

    def forward(self, inputs, train):
        scores = inputs[0].reshape(len(inputs[0]), -1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :self.topk]
        return order.astype(np.float32)


class _Writer(Layer):
    feature_partitionable = False

    def setup(self, src_shapes):
        if not self.conf.store_conf.path:
            raise LayerConfigError("store_conf.path", "missing", "the file to write")
        self.handle = None
        self.written = 0
        return tuple(src_shapes[0])

    def path(self) -> str:
        path = self.conf.store_conf.path
        return path if os.path.isabs(path) else os.path.join(self.ctx.workspace, path)

    def forward(self, inputs, train):
        if self.handle is None:
            os.makedirs(os.path.dirname(self.path()) or ".", exist_ok=True)
            self.handle = self.open()
        self.write(np.asarray(inputs[0]).reshape(len(inputs[0]), -1))
        return inputs[0]


@register("kCSVOutput")
class CSVOutput(_Writer):
    """Appends each input row as a line of ``store_conf.separator``-separated values."""

    def open(self):
        return open(self.path(), "w")

    def write(self, rows: np.ndarray) -> None:
        sep = self.conf.store_conf.separator or ","
        np.savetxt(self.handle, rows, delimiter=sep, fmt="%.8g")
        self.handle.flush()
        self.written += len(rows)


@register("kRecordOutput")
class RecordOutput(_Writer):
    """Writes each input row as a RecordProto (float data, shape) into a kvfile, keys %010d."""

    def open(self):
        return KVFileWriter(self.path())

    def write(self, rows: np.ndarray) -> None:
        for row in rows:
            record = job_pb2.RecordProto(shape=list(self.out_shape), data=row.tolist())
            self.handle.write(f"{self.written:010d}", record)
            self.written += 1
        self.handle.file.flush()
