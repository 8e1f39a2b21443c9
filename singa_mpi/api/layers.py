"""Layers and params of the Python API: each a view of its ``LayerProto`` / ``ParamProto``.

:class:`Layer` takes any layer type (built-in or a plugin's) with its configuration blocks named as in a
``.conf`` file (``innerproduct_conf={"num_output": 10}``); the classes below it are the common types
with their configuration as plain constructor arguments.  Placement and partitioning are arguments of
every layer: ``partition_dim`` (-1 whole, 0 rows, 1 features, ``"auto"``: the cost model's choice) and
``location`` (the worker of a whole layer).
"""
from __future__ import annotations

from typing import Any, Sequence, cast

from singa_mpi.api.fields import ArgumentError, ProtoView, fill, is_integer
from singa_mpi.config.load import AUTO
from singa_mpi.proto import job_pb2

TYPO = 0.85  # difflib's similarity of a mistyped built-in name to its own (kInnerProdct: 0.96, MyReLU to kReLU: 0.73)
PHASES = {"train": "kTrain", "test": "kTest", "val": "kVal", "validation": "kVal"}


# ---------------------------------------------------------------- params and their initialisation

def Init(type: str, **values: float | None) -> dict[str, Any]:  # noqa: N802 - reads as the message it makes
    """A ``ParamGenProto``: ``type`` one of the InitMethod names (``kUniform``, ``kGaussian``, ...),
    and its values (None: the schema's default, unwritten)."""
    return {"type": type, **{key: value for key, value in values.items() if value is not None}}


def Constant(value: float = 0.0) -> dict[str, Any]:  # noqa: N802
    """An init of every value ``value`` (kConstant), for :class:`Param`'s ``init``."""
    return Init("kConstant", value=value)


def Uniform(low: float = -1.0, high: float = 1.0) -> dict[str, Any]:  # noqa: N802
    """An init uniform in [``low``, ``high``] (kUniform), for :class:`Param`'s ``init``."""
    return Init("kUniform", low=low, high=high)


def Gaussian(mean: float | None = None, std: float | None = None) -> dict[str, Any]:  # noqa: N802
    """Normal values, ``mean`` 0 and ``std`` 1 unless given."""
    return Init("kGaussian", mean=mean, std=std)


def default_weights(w: "Param | None", b: "Param | None", bias: bool) -> list["Param"]:
    """A layer's weight and bias params, those not given made with the usual defaults: weights uniform
    in +-1/sqrt(fan-in) (``kUniformSqrtFanIn``), a bias of zeros; unnamed params get their layer's
    name when the layer joins a net (``fc1_w``, ``fc1_b``)."""
    weight = w if w is not None else Param(init=Init("kUniformSqrtFanIn", low=-1.0, high=1.0))
    if not bias:
        return [weight]
    return [weight, b if b is not None else Param(init=Constant(0.0))]


class Param(ProtoView):
    """A layer's parameter: ``name`` (its key in checkpoints), ``init`` (an :func:`Init` dict),
    ``lr_scale`` and ``wd_scale`` (multipliers of the updater's learning rate and weight decay), or
    ``share_from`` (another param's name: the same values)."""

    def __init__(self, name: str | None = None, init: dict[str, Any] | None = None, *, lr_scale: float | None = None,
                 wd_scale: float | None = None, share_from: str | None = None, **more: Any):
        if init is not None and not isinstance(init, dict):
            raise ArgumentError(f"param {name or ''!r}: argument init = {init!r}: expected an init such as "
                                f"Uniform(-0.05, 0.05), Gaussian(std=0.01), Constant(0) or Init(type, ...)")
        self.proto = fill(job_pb2.ParamProto(), dict(name=name, init=init, lr_scale=lr_scale, wd_scale=wd_scale,
                                                     share_from=share_from, **more), f"param {name or ''!r}")

    @property
    def name(self) -> str:
        """The param's name."""
        return self.proto.name

    def __repr__(self) -> str:
        return f"Param({self.proto.name!r})"


# ---------------------------------------------------------------- any layer

class Layer(ProtoView):
    """One layer: its ``type`` (a LayerType name such as ``kInnerProduct``, or a plugin's
    ``user_type``), ``name`` (given by the net when None), ``srcs`` (the layers it reads; a
    :class:`~singa_mpi.api.net.Sequential` connects the previous one when empty), its ``params``,
    ``partition_dim``, ``location``, the phases it runs in (``phase``: ``"train"``, ``"test"``, ...),
    and any other LayerProto field by its name (``innerproduct_conf={...}``, ``unroll_len=...``)."""

    def __init__(self, type: str, name: str | None = None, srcs: str | Sequence[str] = (), *,
                 params: Sequence[Param] = (), partition_dim: int | str | None = None, location: int | None = None,
                 phase: str | Sequence[str] | None = None, exclude: str | Sequence[str] | None = None, **conf: Any):
        self.proto = job_pb2.LayerProto()
        if not isinstance(type, str):
            raise ArgumentError(f"a layer: argument type = {type!r}: expected a layer type's name (kInnerProduct, ...)")
        where = self.where(name if isinstance(name, str) else None, type)
        if name is not None and not isinstance(name, str):
            raise ArgumentError(f"{where}: argument name = {name!r}: expected a string")
        if type in job_pb2.LayerType.keys():
            self.proto.type = job_pb2.LayerType.Value(type)
        else:
            refuse_unknown_type(type, where, mistyped_only=True)
            self.proto.type, self.proto.user_type = job_pb2.kUserLayer, type
        if name is not None:
            self.proto.name = name
        fill(self.proto, dict(srclayers=_sources(srcs, where), param=_params(params, where),
                              partition_dim=_partition_dim(partition_dim, where), location=_location(location, where),
                              include=_phases(phase, where, "phase"), exclude=_phases(exclude, where, "exclude"),
                              **conf), where)

    @staticmethod
    def where(name: str | None, type: str) -> str:
        """How errors name a layer: ``layer 'fc1' (kInnerProduct)``."""
        return f"layer {name!r} ({type})" if name else f"a {type} layer"

    @property
    def name(self) -> str:
        """The layer's name."""
        return self.proto.name

    @property
    def type(self) -> str:
        """The layer's type name (``kInnerProduct``), or its plugin's ``user_type``."""
        proto = self.proto
        return proto.user_type if proto.type == job_pb2.kUserLayer else job_pb2.LayerType.Name(proto.type)

    @property
    def srcs(self) -> list[str]:
        """The names of the layers it reads."""
        return list(self.proto.srclayers)

    @property
    def params(self) -> list[Param]:
        """Its params (weight, bias, ...), as :class:`Param` views of its messages."""
        return [Param.from_proto(p) for p in self.proto.param]

    def __repr__(self) -> str:
        return f"Layer({self.type!r}, {self.name!r}, srcs={self.srcs!r})"


def refuse_unknown_type(type: str, where: str, mistyped_only: bool = False) -> None:
    """ArgumentError for a layer ``type`` that is no built-in and that no loaded plugin registers,
    naming the built-ins it is close to.  ``mistyped_only`` (a layer being built: the job's plugins
    may not be loaded yet): only a type so close to a built-in's name that a typo made it (a plugin's
    ``MyReLU`` is not refused for ``kReLU``)."""
    from singa_mpi.layers.base import LAYERS

    if type in job_pb2.LayerType.keys() or type in LAYERS.user_names():
        return
    if mistyped_only and not LAYERS.close_builtin_names(type, cutoff=TYPO):
        return
    close = LAYERS.close_builtin_names(type)
    builtins = f"a built-in layer type (did you mean {', '.join(close)}?)" if close else "a built-in layer type"
    raise ArgumentError(f"{where}: argument type = {type!r}: expected {builtins} or a plugin's type (no loaded "
                        f"plugin registers {type!r}: Job(..., plugin=[MODULE_OR_FILE]) loads one)")


def _sources(value: Any, where: str) -> list[str]:
    """``srcs`` as the layers' names: one name, a list of names, or None (none)."""
    if value is None:
        return []
    names = [value] if isinstance(value, str) else list(value) if _is_list(value) else None
    if names is None or not all(isinstance(name, str) for name in names):
        raise ArgumentError(f"{where}: argument srcs = {value!r}: expected a layer's name or a list of layers' names")
    return names


def _params(value: Any, where: str) -> list[Param]:
    """``params`` as a list of :class:`Param`."""
    params = list(value) if _is_list(value) else None
    if params is None or not all(isinstance(param, Param) for param in params):
        raise ArgumentError(f"{where}: argument params = {value!r}: expected a list of Param(...)")
    return params


def _is_list(value: Any) -> bool:
    """A sequence of items the API takes as a list (a string or a dict is one value, not a list)."""
    return hasattr(value, "__iter__") and not isinstance(value, (str, bytes, dict))


def _partition_dim(value: int | str | None, where: str) -> int | None:
    if value is None:
        return None
    if value == "auto":
        return AUTO
    if value in (-1, 0, 1) and not isinstance(value, bool):
        return int(value)
    raise ArgumentError(f"{where}: argument partition_dim = {value!r}: expected -1 (whole), 0 (rows), 1 (features) "
                        f"or 'auto'")


def _location(value: int | None, where: str) -> int | None:
    if value is None:
        return None
    if not is_integer(value) or value < 0:
        raise ArgumentError(f"{where}: argument location = {value!r}: expected a worker id (0, 1, ...)")
    return int(value)


def _phases(value: str | Sequence[str] | None, where: str, argument: str) -> list[str] | None:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else list(value) if _is_list(value) else [value]
    phases = []
    for name in names:
        phase = PHASES.get(name, name) if isinstance(name, str) else name
        if not isinstance(phase, str) or phase not in job_pb2.Phase.keys():
            raise ArgumentError(f"{where}: argument {argument} = {name!r}: expected one of "
                                f"{', '.join(list(PHASES) + job_pb2.Phase.keys())}")
        phases.append(phase)
    return phases


# ---------------------------------------------------------------- the common types, with plain arguments
# An argument left None is not written: the layer then takes the schema's default (job.proto), as a
# .conf file that leaves the field out does; a script that mirrors a file passes what the file writes.

def _block(**values: Any) -> dict[str, Any] | None:
    """A configuration block of the arguments given (None: left to the schema's default, unwritten);
    None when no argument was given (no block written, as a .conf file that leaves it out)."""
    given = {key: value for key, value in values.items() if value is not None}
    return given or None


class InnerProduct(Layer):
    """A fully connected layer of ``num_output`` units; ``w`` and ``b`` its params (by default
    :func:`default_weights`; no ``b`` with ``bias=False``)."""

    def __init__(self, num_output: int, name: str | None = None, srcs: str | Sequence[str] = (), *,
                 w: Param | None = None, b: Param | None = None, bias: bool | None = None,
                 transpose: bool | None = None, **common: Any):
        super().__init__("kInnerProduct", name, srcs, params=default_weights(w, b, bias is not False),
                         innerproduct_conf=_block(num_output=num_output, bias_term=bias, transpose=transpose),
                         **common)


Dense = InnerProduct


class Convolution(Layer):
    """``num_filters`` filters of ``kernel`` x ``kernel`` (``stride`` 1, ``pad`` 0 unless given);
    ``kind``: ``kConvolution`` (im2col), ``kCConvolution`` or ``kCudnnConv`` (SINGA's names for the
    same maths); ``w`` and ``b`` as :class:`InnerProduct`'s."""

    def __init__(self, num_filters: int, kernel: int, name: str | None = None, srcs: str | Sequence[str] = (), *,
                 stride: int | None = None, pad: int | None = None, w: Param | None = None, b: Param | None = None,
                 bias: bool | None = None, kind: str = "kConvolution", **common: Any):
        super().__init__(kind, name, srcs, params=default_weights(w, b, bias is not False),
                         convolution_conf=_block(num_filters=num_filters, kernel=kernel, stride=stride, pad=pad,
                                                 bias_term=bias), **common)


class Pooling(Layer):
    """``pool`` (``"MAX"``, the default, or ``"AVG"``) over ``kernel`` x ``kernel`` windows ``stride``
    apart (2 unless given)."""

    def __init__(self, kernel: int, name: str | None = None, srcs: str | Sequence[str] = (), *,
                 stride: int | None = None, pad: int | None = None, pool: str | None = None, kind: str = "kPooling",
                 **common: Any):
        super().__init__(kind, name, srcs, pooling_conf=_block(pool=pool, kernel=kernel, stride=stride, pad=pad),
                         **common)


class LRN(Layer):
    """Local response normalisation over ``local_size`` channels (5, alpha 1, beta 0.75, knorm 1
    unless given)."""

    def __init__(self, name: str | None = None, srcs: str | Sequence[str] = (), *, local_size: int | None = None,
                 alpha: float | None = None, beta: float | None = None, knorm: float | None = None, **common: Any):
        super().__init__("kLRN", name, srcs, lrn_conf=_block(local_size=local_size, alpha=alpha, beta=beta,
                                                             knorm=knorm), **common)


class Dropout(Layer):
    def __init__(self, ratio: float | None = None, name: str | None = None, srcs: str | Sequence[str] = (),
                 **common: Any):
        super().__init__("kDropout", name, srcs, dropout_conf=_block(dropout_ratio=ratio), **common)


class ReLU(Layer):
    def __init__(self, name: str | None = None, srcs: str | Sequence[str] = (), **common: Any):
        super().__init__("kReLU", name, srcs, **common)


class STanh(Layer):
    """SINGA's scaled tanh, 1.7159 tanh(2x/3)."""

    def __init__(self, name: str | None = None, srcs: str | Sequence[str] = (), **common: Any):
        super().__init__("kSTanh", name, srcs, **common)


class Sigmoid(Layer):
    def __init__(self, name: str | None = None, srcs: str | Sequence[str] = (), **common: Any):
        super().__init__("kSigmoid", name, srcs, **common)


class Activation(Layer):
    """``kind``: ``"RELU"``, ``"SIGMOID"``, ``"TANH"`` or ``"STANH"`` (SINGA's kActivation)."""

    def __init__(self, kind: str, name: str | None = None, srcs: str | Sequence[str] = (), **common: Any):
        super().__init__("kActivation", name, srcs, activation_conf={"type": kind}, **common)


class SoftmaxLoss(Layer):
    """Softmax and cross-entropy; ``srcs``: the scores and the layer that gives the labels; ``topk``:
    a row counts as right when its label is among its ``topk`` best scores (1 unless given)."""

    def __init__(self, name: str | None = None, srcs: str | Sequence[str] = (), *, topk: int | None = None,
                 scale: float | None = None, **common: Any):
        super().__init__("kSoftmaxLoss", name, srcs, softmaxloss_conf=_block(topk=topk, scale=scale), **common)


class EuclideanLoss(Layer):
    def __init__(self, name: str | None = None, srcs: str | Sequence[str] = (), **common: Any):
        super().__init__("kEuclideanLoss", name, srcs, **common)


class RecordInput(Layer):
    """A data layer reading a store (``backend`` ``"hdf5"``, ``"csv"``, ...) at ``path``: rows of
    ``shape`` in batches of ``batchsize``, scaled as ``(x - mean_value) / std_value``."""

    def __init__(self, path: str, batchsize: int, shape: int | Sequence[int], name: str | None = None, *,
                 backend: str = "hdf5", kind: str = "kRecordInput", **store: Any):
        common = {key: store.pop(key) for key in ("phase", "exclude", "partition_dim", "location") if key in store}
        where = Layer.where(name if isinstance(name, str) else None, kind)
        if not is_integer(shape) and not _is_list(shape):
            raise ArgumentError(f"{where}: argument shape = {shape!r}: expected a record's shape (an integer or a "
                                f"list of integers)")
        if not is_integer(batchsize) or batchsize <= 0:
            raise ArgumentError(f"{where}: argument batchsize = {batchsize!r}: expected a positive integer")
        dims: list[Any] = [shape] if is_integer(shape) else list(cast(Sequence[int], shape))
        super().__init__(kind, name, (), store_conf=dict(backend=backend, path=path, batchsize=[batchsize],
                                                         shape=dims, **store), **common)


    @classmethod
    def from_arrays(cls, x: Any, y: Any = None, batchsize: int = 64, name: str = "data", **store: Any) -> RecordInput:
        """A data layer reading the arrays ``x`` (one record per row: ``x.shape[1:]`` is the record's
        shape) and ``y`` (one integer label per row, or None) held by this process (backend
        ``memory``).  Every rank of a script under ``mpirun`` holds them and reads only its rows; the
        arrays' digest is in the job, so ranks given different arrays are refused at launch."""
        import numpy as np

        from singa_mpi.data import memory

        where = Layer.where(name, "kRecordInput")
        data = _array(np, x, where, "x")
        if data.ndim < 2 or data.dtype.kind not in "iufb" or len(data) == 0:
            raise ArgumentError(f"{where}: argument x of shape {data.shape} and dtype {data.dtype}: expected numbers, "
                                f"one record per row (at least 2 dimensions, at least one row)")
        labels = None
        if y is not None:
            labels = _array(np, y, where, "y")
            if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
                raise ArgumentError(f"{where}: argument y of shape {labels.shape} and dtype {labels.dtype}: expected "
                                    f"one integer label per row of x ({len(data)},)")
            if labels.min() < 0:
                raise ArgumentError(f"{where}: argument y holds {int(labels.min())}: expected labels from 0")
            outside = memory.label_outside_int32(labels)
            if outside is not None:  # the store holds int32: a cast would train it as another class
                raise ArgumentError(f"{where}: argument y: row {outside[0]}: label {outside[1]}: expected a "
                                    f"class index up to {memory.LABEL_RANGE[1]}")
        path = memory.register(name, data, labels)
        return cls(path, batchsize, list(data.shape[1:]), name, backend="memory",
                   has_label=None if labels is not None else False, **store)


def _array(np: Any, value: Any, where: str, argument: str) -> Any:
    """``value`` as a numpy array; a nested list whose rows differ in length is refused in one line
    (numpy's own error names no argument)."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError):
        raise ArgumentError(f"{where}: argument {argument}: rows of different lengths (a ragged nested list): "
                            f"expected rows of one shape (an array, or lists of equal length)") from None


class CharRNN(Layer):
    """char-rnn's text reader (kCharRNN): ``batchsize`` rows, each a stream of the text read in windows
    of ``unroll_len`` + 1 characters (the net's other layers are unrolled ``unroll_len`` times: give
    ``Net(unroll_len=...)`` the same); ``path`` the text, ``vocab_path`` its vocabulary (each byte
    one symbol: ``singa-mpi data text`` writes both).  The reader itself is not unrolled."""

    def __init__(self, path: str, vocab_path: str, batchsize: int, unroll_len: int, name: str = "data",
                 **common: Any):
        super().__init__("kCharRNN", name, (), unroll_len=1,
                         char_rnn_conf=_block(path=path, vocab_path=vocab_path, batchsize=batchsize,
                                              unroll_len=unroll_len), **common)

    @classmethod
    def from_text(cls, text: str | bytes, batchsize: int, unroll_len: int, vocabulary: str | bytes | None = None,
                  name: str = "data", **common: Any) -> CharRNN:
        """A reader of ``text`` held by this process (a ``str`` is read as its UTF-8 bytes), with
        ``vocabulary`` (default: the text's bytes, sorted); on several ranks every rank holds the text
        and reads its rows' streams.  The digests are in the job, as for arrays."""
        from singa_mpi.data import memory

        where = Layer.where(name, "kCharRNN")
        data = text.encode() if isinstance(text, str) else bytes(text)
        if not data:
            raise ArgumentError(f"{where}: argument text is empty: expected the text to learn")
        symbols = bytes(sorted(set(data))) if vocabulary is None else (
            vocabulary.encode() if isinstance(vocabulary, str) else bytes(vocabulary))
        if len(set(symbols)) != len(symbols):
            raise ArgumentError(f"{where}: argument vocabulary repeats a byte: expected each symbol once "
                                f"(its index is its offset)")
        missing = sorted(set(data) - set(symbols))
        if missing:
            raise ArgumentError(f"{where}: argument vocabulary lacks {bytes(missing[:5])!r} of the text: "
                                f"expected every byte of the text")
        return cls(memory.register_bytes(f"{name}-text", data), memory.register_bytes(f"{name}-vocab", symbols),
                   batchsize, unroll_len, name, **common)


class RBMVis(Layer):
    """The visible side of an RBM; ``srcs``: the data and the hidden layer it pairs with."""

    def __init__(self, hdim: int, name: str | None = None, srcs: str | Sequence[str] = (), *, w: Param | None = None,
                 b: Param | None = None, **common: Any):
        super().__init__("kRBMVis", name, srcs, params=[p for p in (w, b) if p is not None],
                         rbm_conf=_block(hdim=hdim), **common)


class RBMHid(Layer):
    """The hidden side of an RBM (``gaussian``: real-valued hidden units)."""

    def __init__(self, hdim: int, name: str | None = None, srcs: str | Sequence[str] = (), *, w: Param | None = None,
                 b: Param | None = None, gaussian: bool | None = None, bias: bool | None = None, **common: Any):
        super().__init__("kRBMHid", name, srcs, params=[p for p in (w, b) if p is not None],
                         rbm_conf=_block(hdim=hdim, gaussian=gaussian, bias_term=bias), **common)


__all__ = ["Layer", "Param", "Init", "Constant", "Uniform", "Gaussian", "InnerProduct", "Dense", "Convolution",
           "Pooling", "LRN", "Dropout", "ReLU", "STanh", "Sigmoid", "Activation", "SoftmaxLoss", "EuclideanLoss",
           "RecordInput", "CharRNN", "RBMVis", "RBMHid", "PHASES", "default_weights", "refuse_unknown_type"]
