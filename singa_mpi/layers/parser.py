"""SINGA 0.1's input pipeline: a data layer reads records; parser layers make features and labels of them.

    layer { name: "data"  type: kShardData sharddata_conf { path batchsize random_skip } }
    layer { name: "mnist" type: kMnist    srclayers: "data" mnist_conf { norm_a norm_b } }
    layer { name: "rgb"   type: kRGBImage srclayers: "data" rgbimage_conf { scale cropsize mirror meanfile } }
    layer { name: "label" type: kLabel    srclayers: "data" }
    layer { name: "loss"  type: kSoftmaxLoss srclayers: "fc" srclayers: "label" }

kShardData is an input layer like kRecordInput (the same global data order,
batch slices, random skip, wrap-around and reader state, see
:mod:`singa_mpi.layers.input`): its output is the records' raw values, float32
(B_local, *record shape), and its ``aux`` their labels.  The parsers compute on
their source's rows (the very slice when both are split on the batch; the
planner moves rows otherwise), never on a feature slice; the validator checks
that their source is a kShardData layer.

Record shape: SINGA's ShardDataLayer::Setup reads the shard's first record, and
so does setup here when the shard exists; otherwise it is the shape of the data
set the path names (MNIST 28x28, CIFAR-10 3x32x32), so that ``check`` and
``plan`` work before the data is made.  The first forward checks the records.
"""
from __future__ import annotations

import os

import numpy as np

from singa_mpi.data.prepare import how_to_make
from singa_mpi.data.shard import SHARD_FILE, first_record, known_shape, read_mean_file, record_shape
from singa_mpi.data.stores import open_store
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LAYERS, Layer, LayerConfigError
from singa_mpi.layers.input import ImagePreprocess, RecordInput, find_file, resolve_path
from singa_mpi.proto import job_pb2

# MnistProto's elastic-distortion fields: declared by SINGA 0.1-0.3, read by none of its layers
ELASTIC_FIELDS = ("kernel", "sigma", "alpha", "beta", "gamma", "resize", "elastic_freq")


def _how_to_make(path: str, field: str = "path") -> str:
    """The command that writes a DataShard (or, field "mean_file", its mean file) at ``path``."""
    train = os.path.join(os.path.dirname(path), "cifar10_train_shard")  # where v0.1's converter put it
    return how_to_make(path, field, job_pb2.StoreProto(backend="shard", path=train if field != "path" else path),
                       None)


@LAYERS.register("kShardData")
class ShardData(RecordInput):
    """Mini-batches of a DataShard folder (``sharddata_conf.path``), ``batchsize`` rows per global batch.

    Output: (B_local, *record shape) float32, the records' pixels or float data
    as they are; ``aux``: int32 labels (B_local,), or None for unlabelled records.
    """

    def setup(self, src_shapes):
        if not self.conf.HasField("sharddata_conf"):
            raise LayerConfigError("sharddata_conf", "missing", "sharddata_conf { path batchsize }")
        conf = self.conf.sharddata_conf
        if not conf.path:
            raise LayerConfigError("sharddata_conf.path", "missing", "the DataShard folder")
        if conf.batchsize <= 0:
            raise LayerConfigError("sharddata_conf.batchsize", conf.batchsize if conf.HasField("batchsize")
                                   else "missing", "a positive batch size")
        if conf.random_skip < 0:
            raise LayerConfigError("sharddata_conf.random_skip", conf.random_skip, "an integer >= 0")
        self._start_reading(conf.batchsize, "sharddata_conf.batchsize", conf.random_skip, shuffle=False)
        return self._record_shape(conf.path)

    def _record_shape(self, path: str) -> tuple[int, ...]:
        found = resolve_path(path, self.ctx.workspace)
        if found is not None and os.path.isfile(os.path.join(found, SHARD_FILE)):
            try:
                return record_shape(first_record(found))
            except DataError as err:
                raise DataError(f"layer '{self.name}': sharddata_conf.path: {err}") from None
        shape = known_shape(path)
        if shape is None:
            raise LayerConfigError("sharddata_conf.path", repr(path),
                                   f"an existing DataShard folder, whose first record gives the shape of the data "
                                   f"(as in SINGA): {_how_to_make(path)}")
        return shape

    def _open(self) -> None:
        path = self.conf.sharddata_conf.path
        found = find_file(path, self.ctx.workspace, f"layer '{self.name}': sharddata_conf.path",
                          lambda: _how_to_make(path))
        self.store = open_store("shard", found, layer=self.name, shape=self.out_shape)
        self.skip = self._draw_skip()

    def forward(self, inputs, train):
        if self.store is None:
            self._open()
        indices = self.batch_indices(self.global_batch_number())
        data, labels = self.store.read(indices)
        self.batches += 1
        if self.check_finite:
            self.look_for_nonfinite(data, indices)
        self.aux = labels
        return data.reshape((len(data),) + self.out_shape)


class _Parser(Layer):
    """A layer of SINGA 0.1's ParserLayer family: one kShardData source, whole rows."""

    deterministic = True  # row by row: any split of the batch gives the same bits

    input_kinds = ("data",)
    feature_partitionable = False
    feature_split_refusal = "a parser turns whole records into features and labels"
    num_srcs = (1, 1)
    source_types = ("kShardData",)  # what the validator accepts in srclayers

    def backward(self, grad, need):
        return [None]  # parsing sits below every parameter: nothing needs this gradient


@LAYERS.register("kMnist")
class Mnist(_Parser):
    """x / norm_a - norm_b per value in float32, as SINGA 0.1's MnistLayer; (s, s) records -> (1, s, s)."""

    def setup(self, src_shapes):
        conf = self.conf.mnist_conf
        for field in ELASTIC_FIELDS:
            if getattr(conf, field) != 0:
                raise LayerConfigError(f"mnist_conf.{field}", getattr(conf, field),
                                       "0 (unset): elastic distortion is not implemented (SINGA declared the "
                                       "field but its MnistLayer never read it)")
        if conf.norm_a == 0:
            raise LayerConfigError("mnist_conf.norm_a", 0, "a non-zero divisor (default 1)")
        shape = tuple(src_shapes[0])
        if len(shape) < 2 or shape[-1] != shape[-2] or int(np.prod(shape)) != shape[-1] ** 2:
            raise LayerConfigError("srclayers", f"a source of records of shape {shape}",
                                   "square one-channel images (size, size), as SINGA's MnistLayer reads")
        self.norm_a, self.norm_b = np.float32(conf.norm_a), np.float32(conf.norm_b)
        return (1, shape[-1], shape[-1])

    def forward(self, inputs, train):
        x = inputs[0].reshape((len(inputs[0]),) + self.out_shape)  # (B_local, 1, s, s) float32
        return x / self.norm_a - self.norm_b  # SINGA's float arithmetic, operation for operation


@LAYERS.register("kRGBImage")
class RGBImage(ImagePreprocess):
    """SINGA 0.1's RGBImageLayer: (x - mean), cropped and mirrored as kImagePreprocess does, times ``scale``.

    mean: the per-pixel values (C, H, W) of ``rgbimage_conf.meanfile`` (read at
    the first forward; see :func:`singa_mpi.data.shard.read_mean_file`), else 0.
    SINGA differences, on purpose: the mean has the image's shape and is taken
    off before cropping (SINGA shaped it like the crop, so with ``cropsize`` it
    took the wrong pixels off); at test the centre crop (SINGA copied the whole
    image into the smaller blob); crop offsets as kImagePreprocess.  Scale 0
    means no scaling, as SINGA's ``if (scale_)``.
    """

    source_types = ("kShardData",)

    def setup(self, src_shapes):
        self.mean = None
        self.image_shape = tuple(src_shapes[0])
        return self._setup_crop(src_shapes[0], self.conf.rgbimage_conf.scale or 1.0)

    def forward(self, inputs, train):
        if self.mean is None:
            self.mean = self._read_mean()
        return super().forward([inputs[0] - self.mean], train)

    def _read_mean(self) -> np.ndarray:
        path = self.conf.rgbimage_conf.meanfile
        if not path:
            return np.float32(0)
        what = f"layer '{self.name}': rgbimage_conf.meanfile"
        found = find_file(path, self.ctx.workspace, what, lambda: _how_to_make(path, "mean_file"))
        try:
            values = read_mean_file(found)
        except DataError as err:
            raise DataError(f"{what}: {err}") from None
        if values.size != int(np.prod(self.image_shape)):
            raise DataError(f"{what} {path} holds {values.size} values, the images have shape {self.image_shape}")
        return values.reshape(self.image_shape)


@LAYERS.register("kLabel")
class Label(_Parser):
    """The labels of its kShardData source as ``aux`` (what a loss names in srclayers); data: them as float32."""

    input_kinds = ("aux",)
    provides_labels = True  # the validator accepts it as a loss's label source

    def setup(self, src_shapes):
        return ()

    def forward(self, inputs, train):
        labels = inputs[0]  # (B_local,) int32
        if labels is None:
            raise DataError(f"layer '{self.name}': the records of its source carry no label")
        self.aux = labels
        return labels.astype(np.float32)
