"""Input layers: records from a store, normalised; labels published as ``aux``.

The data order is defined on the GLOBAL batch: batch ``k`` holds records
``order[(skip + k·B + r) mod N]`` for r in 0..B-1, where ``skip`` is drawn once
in [0, random_skip] and ``order`` is the identity, or a fresh permutation each
epoch with ``shuffle: true`` (both keyed by the job seed).  A batch-partitioned
sub-layer reads only its rows of that batch, so every partitioning sees the
samples the serial run sees, in the same order.  The store is opened on the
first batch, not in setup, so ``check`` and ``plan`` need no data.
"""
from __future__ import annotations

import os

import numpy as np

from singa_mpi.data.stores import RecordStore, open_store, read_kvfile
from singa_mpi.errors import DataError
from singa_mpi.layers.base import Layer, LayerConfigError, register


def resolve_path(path: str, workspace: str) -> str:
    """As written (relative to the current folder), else relative to the workspace."""
    if os.path.exists(path) or os.path.isabs(path):
        return path
    candidate = os.path.join(workspace, path)
    return candidate if os.path.exists(candidate) else path


@register("kRecordInput", "kCSVInput")
class RecordInput(Layer):
    """Mini-batches from ``store_conf`` (kvfile, textfile or hdf5); per-sample shape ``store_conf.shape``.

    ``batchsize`` is one global size, or one size per data-parallel partition
    (SINGA-131); then the global batch is their sum.  Values become
    (x - mean) / std with ``mean_value``/``mean_file`` and ``std_value``.
    """

    is_input = True
    feature_partitionable = False
    num_srcs = (0, 0)

    def setup(self, src_shapes):
        store = self.conf.store_conf
        if not self.conf.HasField("store_conf"):
            raise LayerConfigError("store_conf", "missing", "store_conf { backend path batchsize shape }")
        if not store.shape:
            raise LayerConfigError("store_conf.shape", "missing", "the per-sample shape, e.g. shape: 784")
        if any(s <= 0 for s in store.shape):
            raise LayerConfigError("store_conf.shape", list(store.shape), "positive dimensions")
        if not store.path:
            raise LayerConfigError("store_conf.path", "missing", "the data file")
        if store.random_skip < 0:
            raise LayerConfigError("store_conf.random_skip", store.random_skip, "an integer >= 0")
        backend = store.backend or ("textfile" if self.conf.type == self.conf.kCSVInput else "")
        if backend not in ("kvfile", "textfile", "hdf5"):
            raise LayerConfigError("store_conf.backend", repr(store.backend), '"kvfile", "textfile" or "hdf5"')
        self.backend = backend
        self.store: RecordStore | None = None
        self.batches = 0
        return tuple(store.shape)

    # -------------------------------------------------------------- reading
    def _open(self) -> RecordStore:
        conf = self.conf.store_conf
        path = resolve_path(conf.path, self.ctx.workspace)
        try:
            store = open_store(self.backend, path, has_label=conf.has_label, separator=conf.separator)
        except DataError as err:
            raise DataError(f"layer '{self.name}': {err}") from None
        if int(np.prod(store.shape)) != int(np.prod(self.out_shape)):
            raise DataError(f"layer '{self.name}': {path} holds samples of shape {store.shape}, "
                            f"store_conf.shape is {self.out_shape}")
        if conf.has_label and store.labels is None:
            raise DataError(f"layer '{self.name}': {path} has no labels (set store_conf.has_label: false?)")
        self.mean = self._mean(conf)
        self.std = np.float32(conf.std_value) if conf.HasField("std_value") and conf.std_value else np.float32(1)
        self.skip = int(self.rng(0).integers(0, conf.random_skip + 1)) if conf.random_skip else 0
        self.orders: dict[int, np.ndarray] = {}
        return store

    def _mean(self, conf) -> np.ndarray | np.float32:
        if conf.mean_file:
            path = resolve_path(conf.mean_file, self.ctx.workspace)
            if not os.path.exists(path):
                raise DataError(f"layer '{self.name}': mean file {path}: no such file")
            mean = read_kvfile(path).data[0]
            if mean.size != int(np.prod(self.out_shape)):
                raise DataError(f"layer '{self.name}': mean file {path} has {mean.size} values, "
                                f"samples have {int(np.prod(self.out_shape))}")
            return mean.reshape(self.out_shape)
        return np.float32(conf.mean_value)

    def _order(self, epoch: int, count: int) -> np.ndarray:
        if not self.conf.store_conf.shuffle:
            return np.arange(count)
        if epoch not in self.orders:
            self.orders = {epoch: self.rng(1, epoch).permutation(count)}  # keep only the current epoch
        return self.orders[epoch]

    def batch_indices(self, batch: int) -> np.ndarray:
        """Record indices of this sub-layer's rows of global batch number ``batch``."""
        count, size = len(self.store), self.ctx.global_batch
        lo, hi = self.ctx.rows()
        positions = self.skip + batch * size + np.arange(lo, hi)
        epochs, within = np.divmod(positions, count)
        out = np.empty(len(positions), np.int64)
        for epoch in np.unique(epochs):  # a batch spans at most two epochs
            mask = epochs == epoch
            out[mask] = self._order(int(epoch), count)[within[mask]]
        return out

    def forward(self, inputs, train):
        if self.store is None:
            self.store = self._open()
        data, labels = self.store.read(self.batch_indices(self.batches))
        self.batches += 1
        self.aux = labels
        data = data.reshape((len(data),) + self.out_shape)
        if isinstance(self.mean, np.ndarray) or self.mean != 0:
            data -= self.mean
        if self.std != 1:
            data /= self.std
        return data

    def state(self) -> dict[str, int]:
        """Where the reader is (for checkpoints)."""
        return {"batches": self.batches}

    def load_state(self, state: dict[str, int]) -> None:
        self.batches = int(state["batches"])


@register("kImagePreprocess")
class ImagePreprocess(Layer):
    """Crop to ``cropsize`` (random in training, centre at test), random mirror, multiply by ``scale``.

    Offsets and mirror flags are drawn per GLOBAL sample from (seed, layer, step),
    so partitioned runs crop exactly as the serial run.  Labels stay with the
    data layer: losses take them from there.
    """

    num_srcs = (1, 1)
    feature_partitionable = False

    def setup(self, src_shapes):
        shape = tuple(src_shapes[0])
        if len(shape) != 3:
            raise LayerConfigError("srclayers", f"output shape {shape}", "a (channels, height, width) source")
        crop = self.conf.rgbimage_conf.cropsize
        if crop < 0 or crop > min(shape[1:]):
            raise LayerConfigError("rgbimage_conf.cropsize", crop, f"0 (no crop) .. {min(shape[1:])}")
        self.crop = crop
        return (shape[0], crop, crop) if crop else shape

    def forward(self, inputs, train):
        x = inputs[0]
        conf = self.conf.rgbimage_conf
        batch, (_, h, w) = self.ctx.global_batch, x.shape[1:]
        lo, hi = self.ctx.rows()
        crop = self.crop or min(h, w)
        if train:
            rng = self.rng(self.ctx.step)
            tops = rng.integers(0, h - crop + 1, batch)[lo:hi]
            lefts = rng.integers(0, w - crop + 1, batch)[lo:hi]
            flips = (rng.random(batch) < 0.5)[lo:hi] if conf.mirror else np.zeros(hi - lo, bool)
        else:
            tops = np.full(hi - lo, (h - crop) // 2)
            lefts = np.full(hi - lo, (w - crop) // 2)
            flips = np.zeros(hi - lo, bool)
        rows = tops[:, None] + np.arange(crop)  # (B, crop)
        cols = lefts[:, None] + np.arange(crop)
        cols = np.where(flips[:, None], cols[:, ::-1], cols)
        out = x[np.arange(len(x))[:, None, None, None], np.arange(x.shape[1])[None, :, None, None],
                rows[:, None, :, None], cols[:, None, None, :]]
        if conf.scale != 1:
            out = out * np.float32(conf.scale)
        return out.astype(x.dtype, copy=False)

    def backward(self, grad, need):
        return [None]
