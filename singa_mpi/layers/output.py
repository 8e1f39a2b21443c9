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
from singa_mpi.layers.base import LAYERS, Layer, LayerConfigError, layer_class_of
from singa_mpi.proto import job_pb2


@LAYERS.register("kAccuracy")
class Accuracy(Layer):
    """Top-1 accuracy of predictions (rows, classes...) against the labels of srclayers[1].

    Metrics (sums since the last call): accuracy = rows whose argmax is the
    label, accuracy/count = rows.  Output: the predictions, unchanged.
    """

    deterministic = True  # row by row: any split of the batch gives the same bits

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

    deterministic = True  # row by row: any split of the batch gives the same bits

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

    Resuming: the carried state (``state()``, kept in checkpoints) is the file's length and
    row count after the batches trained so far.  A resumed layer cuts the file back to that
    length, dropping the rows of batches trained after the checkpoint, and appends, so the
    file ends as an uninterrupted run's.  Only the rank that runs the layer (its location;
    it is never split) writes the file and carries that state.
    """

    feature_partitionable = False
    micro_batch_refusal = "it writes whole batches to one file"
    backend = ""
    key_format = "{:05d}"

    def setup(self, src_shapes):
        if not self.conf.store_conf.path:
            raise LayerConfigError("store_conf.path", "missing", "the file to write")
        lo, hi = self.ctx.rows()
        if (lo, hi) != (0, self.ctx.global_batch):
            raise LayerConfigError("partition_dim", 0, "-1: an output layer writes whole batches to one file")
        self.writer: StoreWriter | None = None
        self.written = 0  # rows in the file
        self.length = 0  # bytes in the file
        self.resumed: tuple[int, int] | None = None  # (bytes, rows) a checkpoint says the file held
        return tuple(src_shapes[0])

    def path(self) -> str:
        return output_path(self.conf, self.ctx.workspace)

    def forward(self, inputs, train):
        rows = np.asarray(inputs[0]).reshape((len(inputs[0]),) + self.out_shape)
        try:
            if self.writer is None:  # opened on the first batch: check/plan create no files
                self.writer = self._open()
                self._finalizer = weakref.finalize(self, self.writer.close)
            self.writer.write_batch(rows)
            self.writer.flush()  # readable while the job runs
            self.length = os.fstat(self.writer.file.fileno()).st_size
        except OSError as err:  # a folder that cannot be made, a read-only or full disk
            reason = err.strerror or " ".join(str(err).split())
            raise DataError(f"layer '{self.name}': {self.path()}: cannot write this output file: {reason}: "
                            f"expected a writable path (store_conf.path)") from None
        self.written += len(rows)
        return inputs[0]

    def _open(self) -> StoreWriter:
        path = self.path()
        options = {"separator": self.conf.store_conf.separator, "key_format": self.key_format}
        if self.resumed is None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            return open_store(self.backend, path, "w", **options)
        length, rows = self.resumed
        found = os.path.getsize(path) if os.path.isfile(path) else None
        if found is None or found < length:
            held = "no such file" if found is None else f"{found} bytes"
            raise DataError(f"layer '{self.name}': {path}: {held}, but it held {length} bytes ({rows} rows) at the "
                            f"checkpoint of step {self.ctx.step} this run resumes from: expected the file as "
                            f"the stopped run left it (put it back, or start afresh with --overwrite)")
        os.truncate(path, length)  # rows of batches trained after the checkpoint
        # the store's writers create their file: one is made on the null device, then given this file
        writer = open_store(self.backend, os.devnull, "w", **options)
        writer.file.close()
        writer.file = open(path, "ab" if self.backend == "kvfile" else "a")
        writer.path = path
        if hasattr(writer, "keys"):  # a kvfile's keys count the rows written before
            writer.keys = {self.key_format.format(i).encode() for i in range(rows)}
        return writer

    def backward(self, grad, need):
        return [None]

    def state(self) -> dict[str, int]:
        return {"bytes": self.length, "rows": self.written}

    def load_state(self, state: dict[str, int]) -> None:
        self.length, self.written = int(state.get("bytes", 0)), int(state.get("rows", 0))
        self.resumed = (self.length, self.written)

    def close_files(self) -> None:
        """Close the output file (idempotent)."""
        if self.writer is not None:
            self._finalizer()


def output_files(job: job_pb2.JobProto, workspace: str) -> list[str]:
    """The files the job's output layers write (any phase), once each, in the job's order."""
    paths = [output_path(conf, workspace) for conf in job.neuralnet.layer
             if issubclass(layer_class_of(conf), _StoreOutput)]
    return list(dict.fromkeys(paths))


def output_path(conf: job_pb2.LayerProto, workspace: str) -> str:
    """The file an output layer writes: ``store_conf.path``, under the workspace if relative."""
    path = conf.store_conf.path
    return path if os.path.isabs(path) else os.path.join(workspace or ".", path)


@LAYERS.register("kCSVOutput")
class CSVOutput(_StoreOutput):
    """Each input row as one line of ``store_conf.separator``-separated values (no label column)."""

    backend = "textfile"


@LAYERS.register("kRecordOutput")
class RecordOutput(_StoreOutput):
    """Each input row as a RecordProto (float data, shape) in a kvfile, keys "%010d" of a running count."""

    backend = "kvfile"
    key_format = "{:010d}"
