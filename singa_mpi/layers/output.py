"""Output layers: accuracy, top-k indices, and writing features to CSV or kvfile stores.

None has parameters or passes a gradient (backward returns Nones).  Accuracy
and argsort work on any rows of the batch.  The writers append whole batches
to one file, so they must run unpartitioned (``partition_dim: -1``): setup
rejects a proper batch slice, and no output layer splits features.
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from singa_mpi.data.stores import StoreWriter, open_store
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LAYERS, Layer, LayerConfigError


@LAYERS.register("kAccuracy")
class Accuracy(Layer):
    """Top-1 accuracy of predictions (rows, classes...) against the labels of srclayers[1].

    Metrics (sums since the last call): accuracy = rows whose argmax is the
    label, accuracy/count = rows.  Output: the predictions, unchanged.
    """

    input_kinds = ("data", "aux")
    num_srcs = (2, 2)
    feature_partitionable = False

    def setup(self, src_shapes):
        self._reset()
        return tuple(src_shapes[0])

    def _reset(self) -> None:
        self.sums = {"accuracy": 0.0, "accuracy/count": 0.0}

    def forward(self, inputs, train):
        scores = inputs[0].reshape(len(inputs[0]), -1)  # (rows, classes)
        labels = np.asarray(inputs[1]).reshape(-1)
        if len(labels) != len(scores):
            raise DataError(f"layer '{self.name}': {len(labels)} labels for {len(scores)} rows of predictions")
        self.sums["accuracy"] += float(np.count_nonzero(scores.argmax(axis=1) == labels))
        self.sums["accuracy/count"] += len(labels)
        return inputs[0]

    def backward(self, grad, need):
        return [None, None]

    def metrics(self):
        sums = self.sums
        self._reset()
        return sums if sums["accuracy/count"] else {}


@LAYERS.register("kArgSort")
class ArgSort(Layer):
    """Indices of the ``topk`` largest scores of each row, largest first, as floats.  # (rows, topk)

    Ties go to the lower index, like argmax.
    """

    feature_partitionable = False

    def setup(self, src_shapes):
        self.topk = self.conf.argsort_conf.topk
        classes = int(np.prod(src_shapes[0]))
        if not 1 <= self.topk <= classes:
            raise LayerConfigError("argsort_conf.topk", self.topk, f"1..{classes} (the number of scores per row)")
        return (self.topk,)

    def forward(self, inputs, train):
        scores = inputs[0].reshape(len(inputs[0]), -1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :self.topk]
        return order.astype(inputs[0].dtype if np.issubdtype(inputs[0].dtype, np.floating) else np.float32)

    def backward(self, grad, need):
        return [None]


class _StoreOutput(Layer):
    """Appends each forward's input rows to ``store_conf.path`` (under the workspace if relative).

    Writes whatever rows its source gives (no ``store_conf.batchsize``).  The file is
    closed by ``close_files()`` (the trainer calls it on every exit path), else when the
    layer is garbage-collected or the interpreter exits.
    """

    feature_partitionable = False
    backend = ""
    key_format = "{:05d}"

    def setup(self, src_shapes):
        if not self.conf.store_conf.path:
            raise LayerConfigError("store_conf.path", "missing", "the file to write")
        lo, hi = self.ctx.rows()
        if (lo, hi) != (0, self.ctx.global_batch):
            raise LayerConfigError("partition_dim", 0, "-1: an output layer writes whole batches to one file")
        self.writer: StoreWriter | None = None
        self.written = 0
        return tuple(src_shapes[0])

    def path(self) -> str:
        path = self.conf.store_conf.path
        return path if os.path.isabs(path) else os.path.join(self.ctx.workspace or ".", path)

    def forward(self, inputs, train):
        if self.writer is None:  # opened on the first batch: check/plan create no files
            os.makedirs(os.path.dirname(self.path()) or ".", exist_ok=True)
            self.writer = open_store(self.backend, self.path(), "w", separator=self.conf.store_conf.separator,
                                     key_format=self.key_format)
            self._finalizer = weakref.finalize(self, self.writer.close)
        rows = np.asarray(inputs[0]).reshape((len(inputs[0]),) + self.out_shape)
        self.writer.write_batch(rows)
        self.writer.flush()  # readable while the job runs
        self.written += len(rows)
        return inputs[0]

    def backward(self, grad, need):
        return [None]

    def close_files(self) -> None:
        """Close the output file (idempotent)."""
        if self.writer is not None:
            self._finalizer()


@LAYERS.register("kCSVOutput")
class CSVOutput(_StoreOutput):
    """Each input row as one line of ``store_conf.separator``-separated values (no label column)."""

    backend = "textfile"


@LAYERS.register("kRecordOutput")
class RecordOutput(_StoreOutput):
    """Each input row as a RecordProto (float data, shape) in a kvfile, keys "%010d" of a running count."""

    backend = "kvfile"
    key_format = "{:010d}"
