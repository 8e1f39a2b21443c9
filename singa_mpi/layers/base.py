"""The layer interface, the layer registry and the per-sub-layer context.

A layer computes on whatever slice of the batch (rows) and of its output
features (axis 1) it is given.  It never sees a rank: the planner decides the
slices, the runtime fills a :class:`LayerContext`, and the layer's maths only
reads ``ctx.batch_slice`` / ``ctx.feature_slice`` where it must (parameter
shards, random masks keyed by global indices, loss normalisation).

Lifecycle of one (sub-)layer::

    layer = cls(conf, ctx)
    out_shape = layer.setup(src_shapes)  # logical per-sample shapes; declares ParamSpecs
    <framework allocates layer.params from the specs: init, share, shard>
    y = layer.forward(inputs, train)     # inputs: local arrays, rows = local batch
    gx = layer.backward(dy, need)        # returns input grads, *accumulates* param grads

Shapes passed to ``setup`` exclude the batch dimension and are *logical*
(unpartitioned).  Arrays passed to ``forward`` have the local batch as axis 0
and, for a feature-partitioned OneToOne layer, the local feature slice on axis 1.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Sequence

import numpy as np

from singa_mpi.params import keyed_rng
from singa_mpi.proto import job_pb2
from singa_mpi.registry import Registry, selected_name

Shape = tuple[int, ...]

# How a layer consumes its source's output when the net is partitioned
# (seed 004's table): OneToAll layers need the whole input feature vector.
ONE_TO_ONE = "OneToOne"
ONE_TO_ALL = "OneToAll"

LAYERS: Registry[type[Layer]] = Registry("layer type")


def layer_class(type_name: str) -> type[Layer]:
    """The class registered for ``type_name``; ConfigError listing valid names otherwise."""
    return LAYERS.get(type_name)


def layer_type_name(conf: job_pb2.LayerProto) -> str:
    """The registry name a layer selects: its ``user_type`` when written (a plugin's layer, as in
    SINGA 0.3), else the name of its ``type``."""
    return selected_name(conf)


def layer_class_of(conf: job_pb2.LayerProto) -> type[Layer]:
    """The class a layer selects; ConfigError (``type = ...`` / ``user_type = ...``) listing valid names."""
    return LAYERS.select(conf)


# The built-in layers, by family module.  Each class registers itself with its decorator when its
# family is imported; these strings let a lookup import the family on demand, so that this module
# never imports a family (the families import it).  tests/test_registry.py keeps the two in step.
_BUILT_IN: dict[str, tuple[str, ...]] = {  # "family:Class": SINGA type names
    "input:RecordInput": ("kRecordInput", "kCSVInput"),
    "input:ImagePreprocess": ("kImagePreprocess",),
    "parser:ShardData": ("kShardData",),
    "parser:Mnist": ("kMnist",),
    "parser:RGBImage": ("kRGBImage",),
    "parser:Label": ("kLabel",),
    "neuron:InnerProduct": ("kInnerProduct",),
    "neuron:ReLU": ("kReLU",),
    "neuron:Sigmoid": ("kSigmoid",),
    "neuron:STanh": ("kSTanh",),
    "neuron:Activation": ("kActivation", "kCudnnActivation"),
    "neuron:Dropout": ("kDropout",),
    "neuron:Softmax": ("kSoftmax", "kCudnnSoftmax"),
    "neuron:Embedding": ("kEmbedding",),
    "neuron:OneHot": ("kOneHot",),
    "conv:Convolution": ("kConvolution", "kCConvolution", "kCudnnConv"),
    "conv:Pooling": ("kPooling", "kCPooling", "kCudnnPool"),
    "conv:LRN": ("kLRN", "kCudnnLRN"),
    "loss:SoftmaxLoss": ("kSoftmaxLoss", "kCudnnSoftmaxLoss"),
    "loss:EuclideanLoss": ("kEuclideanLoss",),
    "output:Accuracy": ("kAccuracy",),
    "output:ArgSort": ("kArgSort",),
    "output:CSVOutput": ("kCSVOutput",),
    "output:RecordOutput": ("kRecordOutput",),
    "rbm:RBMVis": ("kRBMVis",),
    "rbm:RBMHid": ("kRBMHid",),
    "rnn:GRU": ("kGRU",),
    "batchnorm:BatchNorm": ("kBM", "kCudnnBM"),
    "text:CharRNN": ("kCharRNN",),
    "text:RNNLabel": ("kRNNLabel",),
    "text:CharRNNOutput": ("kCharRNNOutput",),
    "text:RNNDummy": ("kRNNDummy",),
}


def _register_built_ins() -> None:
    for where, names in _BUILT_IN.items():
        for name in names:
            LAYERS.register_lazy(name, f"singa_mpi.layers.{where}")


_register_built_ins()


class LayerConfigError(Exception):
    """Raised by ``Layer.setup``; the validator adds file, line and layer name."""

    def __init__(self, field: str, value: object, expected: str):
        super().__init__(f"{field} = {value}: expected {expected}")
        self.field, self.value, self.expected = field, value, expected


@dataclasses.dataclass
class LayerContext:
    """What a (sub-)layer knows of its place in the job; never a rank.

    batch_slice:   rows ``[lo, hi)`` of the global mini-batch this sub-layer computes.
    feature_slice: ``[lo, hi)`` of the output's axis 1 this sub-layer computes,
                   or None for the whole axis.
    global_batch:  rows in the global mini-batch (loss layers normalise by it).
    seed:          the job seed; random streams are keyed by (seed, step, layer, index).
    step:          the current training step, set by the trainer before each batch.
    workspace:     folder for output layers' files and relative store paths.
    allreduce:     for a layer with batch statistics split on the batch: sums an array over
                   the workers holding the batch's other rows (set by the runtime; None when
                   this sub-layer holds every row).  A function, not a rank.
    stream:        (g, G): this net belongs to worker group g of G, which reads global batches
                   g, g + G, g + 2G, ... of the data order (each group its own part of the
                   data, as SINGA's groups are); (0, 1) for one group.  A text reader
                   (kCharRNN) reads group g's contiguous part of the text instead.
    block_rows:    deterministic mode's canonical blocks of rows (products over rows run one
                   block at a time, param gradients from per-row terms); None: the default mode.
    """

    global_batch: int = 1
    batch_slice: tuple[int, int] | None = None
    feature_slice: tuple[int, int] | None = None
    seed: int = 0
    step: int = 0
    workspace: str = "."
    phase: str = "train"
    allreduce: Callable[[np.ndarray], np.ndarray] | None = None
    stream: tuple[int, int] = (0, 1)
    block_rows: int | None = None

    def rows(self) -> tuple[int, int]:
        return self.batch_slice if self.batch_slice is not None else (0, self.global_batch)

    def features(self, total: int) -> tuple[int, int]:
        return self.feature_slice if self.feature_slice is not None else (0, total)


@dataclasses.dataclass
class ParamSpec:
    """A parameter a layer declares in setup; the framework allocates it.

    logical_shape is the unpartitioned shape; ``shard`` selects this sub-layer's
    part of it (a tuple of (lo, hi) per axis).  fan_in/fan_out feed the
    *SqrtFanIn* init methods (SINGA uses shape[1] and shape[0] of 2-D params).
    """

    conf: job_pb2.ParamProto
    logical_shape: Shape
    shard: tuple[tuple[int, int], ...]
    role: str  # "weight", "bias", ... (for messages)
    # The layer's backward adds this param's gradient as one product a @ b whose inner
    # dimension is its local batch rows (a: (shape[0], rows), b: (rows, shape[1])).  A runtime
    # may then gather those factors from the ranks that replicate the param and compute
    # slices of the summed gradient from them, instead of summing whole gradients.
    batch_factored: bool = False
    # False for state the layer itself writes (batch norm's running statistics): never updated
    # nor synchronised by the framework, kept in checkpoints
    trained: bool = True

    @property
    def shard_shape(self) -> Shape:
        return tuple(hi - lo for lo, hi in self.shard)


def check_shape(what: str, shape) -> None:
    """ValueError unless ``shape`` is a sequence of whole numbers > 0 (what a plugin's setup returns
    and declares: a bad one used to pass `check` and fail in numpy at the first step)."""
    try:
        good = all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 for n in shape)
    except TypeError:
        good = False
    if not good:
        raise ValueError(f"{what} {shape!r}: expected whole numbers > 0 (a per-sample shape, the batch left out)")


def row_blocks(rows: int, block_rows: int) -> list[tuple[int, int]]:
    """Deterministic mode's canonical blocks of ``rows`` rows that start on a block's first row:
    ``[lo, hi)`` of each, ``block_rows`` long but the last.  A worker's rows are whole blocks (the
    planner's split), so a block holds the same rows, and its GEMM the same shapes, on any worker."""
    return [(lo, min(lo + block_rows, rows)) for lo in range(0, rows, block_rows)]


def rows_product(a: np.ndarray, b: np.ndarray, block_rows: int | None) -> np.ndarray:
    """a @ b over the rows of ``a``; in deterministic mode (``block_rows`` set) one product per
    canonical block, so that a worker's rows give the bits the whole batch gives for them."""
    if block_rows is None:
        return a @ b
    out = np.empty((len(a), b.shape[1]), np.result_type(a, b))
    for lo, hi in row_blocks(len(a), block_rows):
        out[lo:hi] = a[lo:hi] @ b
    return out


BLOCK_MARK = "@"  # a metric's partial sum over one canonical block: "loss@3" (deterministic mode)


def sum_over_rows(ctx: LayerContext, sums: dict[str, float], key: str, rows: int,
                  partial: Callable[[int, int], float]) -> None:
    """``sums[key] += partial(0, rows)``, the sum of a metric over this sub-layer's rows; in
    deterministic mode one sum per canonical block instead, under ``key@b`` (b: the block's index in
    the batch), as the block's rows give it on any worker: :func:`fold_block_sums` adds them in
    block order once every worker's are in, so the total does not depend on the split."""
    if ctx.block_rows is None:
        sums[key] += partial(0, rows)
        return
    first = ctx.rows()[0] // ctx.block_rows  # a worker's rows start on a block's first row
    for index, (lo, hi) in enumerate(row_blocks(rows, ctx.block_rows)):
        name = f"{key}{BLOCK_MARK}{first + index}"
        sums[name] = sums.get(name, 0.0) + partial(lo, hi)


def fold_block_sums(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` with each metric's per-block sums (:func:`sum_over_rows`) added into it in block
    order, the same order for any number of workers."""
    blocks: dict[str, list[tuple[int, float]]] = {}
    folded = {}
    for key, value in metrics.items():
        base, mark, index = key.rpartition(BLOCK_MARK)
        if mark and index.isdigit():
            blocks.setdefault(base, []).append((int(index), value))
        else:
            folded[key] = value
    for base, parts in blocks.items():
        total = folded.get(base, 0.0)
        for _, value in sorted(parts):
            total += value
        folded[base] = total
    return folded


class Layer:
    """Base class; subclasses implement setup/forward/backward."""

    connection: ClassVar[str] = ONE_TO_ONE
    # How each source is consumed: "data" (its output) or "aux" (its labels).
    input_kinds: ClassVar[tuple[str, ...]] = ()
    is_input: ClassVar[bool] = False
    is_loss: ClassVar[bool] = False
    # Whether partition_dim 1 is meaningful; the planner rejects it otherwise, saying why
    # (``feature_split_refusal``, else a reason from the layer's kind).
    feature_partitionable: ClassVar[bool] = True
    feature_split_refusal: ClassVar[str] = ""
    # Why this layer's rows cannot be split over workers (its rows are the steps of one sequence, not
    # independent samples); set, an inherited partition_dim 0 runs it whole on its location instead.
    batch_split_refusal: ClassVar[str] = ""
    # Minimum and maximum number of srclayers (None = unbounded).
    num_srcs: ClassVar[tuple[int, int | None]] = (1, 1)
    # Under partition_dim 1 this layer's sub-layers split the batch rows instead of its own
    # output features, and ``feature_units()`` units of a partner layer (an RBM's visible layer).
    feature_split_rows: ClassVar[bool] = False
    # "visible" or "hidden" for the two halves of an energy model (how CD finds the pairs).
    energy_role: ClassVar[str] = ""
    # A recurrent layer (kGRU): its first copy over time can start from a carried hidden state
    # (``initial_state``; algorithms/bptt.py carries it from batch to batch)
    recurrent: ClassVar[bool] = False
    # Computes statistics over the whole batch: split on the batch, its sub-layers sum them over
    # the workers through ``ctx.allreduce`` (the planner schedules those sums).
    batch_statistics: ClassVar[bool] = False
    # Why this layer cannot run on micro-batches of a pipelined step (each block of rows on its own,
    # one after another): set, ``check`` refuses a pipelined net that holds it, naming the layer.
    micro_batch_refusal: ClassVar[str] = ""
    # The arrays a forward pass keeps for its backward (besides ``data``, ``grad`` and ``aux``):
    # :meth:`release` drops them once a pipeline's micro-batch is done with this layer.
    per_batch: ClassVar[tuple[str, ...]] = ()
    # Deterministic mode covers this layer: its outputs and gradients are computed row by row, or
    # its products over rows block by block (``ctx.block_rows``) and its param gradients as per-row
    # terms (``Param.add_rows``), so any split of the batch gives the same bits.  Opt in: a layer
    # that sums over the batch some other way would silently break the mode.
    deterministic: ClassVar[bool] = False
    deterministic_refusal: ClassVar[str] = ""  # why not (else a generic reason)
    # What one of its param gradients' terms is: "rows", one per batch row (an inner product's
    # output-gradient and input rows, grad = Σ leftᵀ·right), "pairs", two per batch row (an RBM's
    # positive and negative phases, row by row), or "blocks", one per canonical block (a
    # convolution's per-block weight gradient, flattened: grad = Σ over the blocks in order).
    deterministic_terms: ClassVar[str] = "rows"

    @classmethod
    def terms_for(cls, role: str) -> str:
        """Deterministic mode: the kind of terms this layer adds to its param of ``role`` ("" for a
        param it holds but adds nothing to, as an RBM's visible layer its shared weight)."""
        return cls.deterministic_terms

    def __init__(self, conf: job_pb2.LayerProto, ctx: LayerContext | None = None):
        self.conf = conf
        self.name = conf.name
        self.ctx = ctx or LayerContext()
        self.param_specs: list[ParamSpec] = []
        self.params: list = []  # filled by the framework, same order as param_specs
        self.out_shape: Shape = ()
        self.data: np.ndarray | None = None
        self.aux: np.ndarray | None = None
        # per source: whether backward will be asked for its gradient (set by the net once its graph
        # is built, before the first pass; None for a layer used on its own: assume every one)
        self.input_grads: list[bool] | None = None

    # -- configuration -------------------------------------------------------
    @classmethod
    def batch_field(cls, conf: job_pb2.LayerProto) -> tuple[str, int] | None:
        """For an input layer whose batch size its own config gives: (the field, for messages, and the
        global batch size).  The built-in readers' store_conf / sharddata_conf / char_rnn_conf are
        known to the framework; a plugin's input layer overrides this."""
        return None

    @classmethod
    def input_files(cls, conf: job_pb2.LayerProto) -> list[tuple[str, str, str, str]]:
        """(config block, field, path, how to make it) of each file this layer reads, so that a missing
        one is reported before any communication.  The built-in readers' are known to the framework;
        a plugin's reader overrides this (the block may be an extension: ``"[data_conf]"``)."""
        return []

    @classmethod
    def work_bytes(cls, conf: job_pb2.LayerProto, rows: int, in_shape: Shape, out_shape: Shape,
                   backward: bool = True, input_grad: bool = True) -> tuple[int, int]:
        """(held, passing) bytes this layer allocates besides its output and the output's gradient, at
        ``rows`` rows of ``in_shape`` (its first source's per-sample shape, whole) giving ``out_shape``
        (this part's per-sample shape), in a net that runs its backward (``backward``; else forward
        alone: a test net), which asks it for its input's gradient (``input_grad``): ``held`` stays from
        forward to backward or from step to step (work arrays, masks, saved spectra), ``passing`` lives
        inside one forward or backward only.  The memory check (:func:`singa_mpi.cost.auto.memory_by_rank`)
        adds every layer's ``held`` and the largest ``passing`` of a rank.  Default: nothing beyond the
        output (a layer that keeps only references to its inputs)."""
        return 0, 0

    def setup(self, src_shapes: Sequence[Shape]) -> Shape:
        """Check the conf against the logical source shapes; return the logical output shape."""
        raise NotImplementedError

    def declare_param(self, index: int, role: str, logical_shape: Shape, shard_axis: int | None,
                      batch_factored: bool = False, trained: bool = True) -> None:
        """Declare ``conf.param[index]``; sharded on ``shard_axis`` by the feature slice.

        ``batch_factored``, ``trained``: see :class:`ParamSpec`."""
        if index >= len(self.conf.param):
            raise LayerConfigError(f"param[{index}]", "missing", f"a param {{ name: ... }} for the {role}")
        check_shape(f"declare_param({index}, {role!r}): shape", logical_shape)
        if shard_axis is not None and not 0 <= shard_axis < len(logical_shape):
            raise ValueError(f"declare_param({index}, {role!r}): shard_axis = {shard_axis}: expected an axis of its "
                             f"{len(logical_shape)}-D shape {tuple(logical_shape)} (or None: not split)")
        shard = [(0, n) for n in logical_shape]
        if shard_axis is not None and self.ctx.feature_slice is not None:
            shard[shard_axis] = self.ctx.feature_slice
        self.param_specs.append(ParamSpec(self.conf.param[index], tuple(logical_shape), tuple(shard), role,
                                          batch_factored, trained))

    def example_input(self, index: int, shape: Shape, rng: np.random.Generator) -> np.ndarray:
        """An input this set-up layer accepts from source ``index``, of local shape ``shape`` (rows
        first): what the cost model times its kernel on.  Floats from N(0, 1); a layer that reads ids
        (kOneHot, kEmbedding) overrides this, as may a plugin's."""
        return rng.standard_normal(shape).astype(np.float32)

    def feature_units(self) -> int:
        """How many units ``partition_dim: 1`` splits: the output features (axis 1) by default."""
        return self.out_shape[0] if self.out_shape else 1

    def local_out_shape(self) -> Shape:
        """This sub-layer's output shape per sample (feature slice applied to axis 1)."""
        if not self.out_shape:
            return self.out_shape
        lo, hi = self.ctx.features(self.out_shape[0])
        return (hi - lo,) + tuple(self.out_shape[1:])

    # -- computation ---------------------------------------------------------
    def forward(self, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        raise NotImplementedError

    def backward(self, grad: np.ndarray | None, need: list[bool]) -> list[np.ndarray | None]:
        """Gradients w.r.t. the inputs (None where ``need`` is False); param grads accumulate."""
        return [None] * len(need)

    def compute(self, phase: str, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        """The output for one of an algorithm's named passes over the net.

        BP has one pass, ``"forward"``.  Other algorithms name theirs (CD: a positive
        and a negative pass); most layers compute the same thing in every pass, so
        only layers whose maths differs per pass (an RBM's) override this."""
        return self.forward(inputs, train)

    def release(self) -> None:
        """Drop what this batch's passes kept (output, gradient, labels, ``per_batch``): a pipelined step
        frees a micro-batch's activations after its backward (1F1B then holds only the micro-batches in
        flight).  The next forward computes them afresh."""
        for name in ("data", "grad", "aux") + self.per_batch:
            setattr(self, name, None)

    def param_gradients(self) -> None:
        """Add this layer's param gradients from what its passes kept (algorithms whose
        gradients are not back-propagated, such as contrastive divergence, call it)."""
        raise NotImplementedError(f"{type(self).__name__} computes its param gradients in backward")

    def edge(self) -> tuple[str, str] | None:
        """For a connection layer, the (source, destination) layers of the edge it serves."""
        return None

    # -- carried state (checkpoints) -------------------------------------------
    def state(self) -> dict[str, int | float]:
        """What this layer carries from step to step besides params (a reader's position,
        later a recurrent state); checkpoints store it and ``load_state`` puts it back."""
        return {}

    def load_state(self, state: dict[str, int | float]) -> None:
        if state:
            raise ValueError(f"layer {self.name!r} carries no state, got {sorted(state)}")

    def carried(self) -> dict[str, np.ndarray]:
        """Arrays this layer carries from batch to batch, one row per row it computes (an RNN's
        hidden state); checkpoints assemble them over the global batch and ``load_carried`` puts
        this sub-layer's rows back."""
        return {}

    def load_carried(self, name: str, value: np.ndarray) -> None:
        raise ValueError(f"layer {self.name!r} carries no array {name!r}")

    def metrics(self) -> dict[str, float]:
        """Sums over this sub-layer's rows since the last call (loss/output layers)."""
        return {}

    @classmethod
    def report(cls, metrics: dict[str, float]) -> dict[str, float]:
        """The metrics a progress line shows, from the means over all workers (after the algorithm's
        own ``report``): a layer may add one derived from them (a perplexity from the loss)."""
        return metrics

    def rng(self, *key: int) -> np.random.Generator:
        """A random stream keyed by (seed, layer name, *key), independent of rank and order."""
        return keyed_rng(self.ctx.seed, self.conf.name, *key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
