"""SINGA 0.3 binding's layers: each holds the LayerProto it stands for (``layer``), named and set up
as the binding did, so that a script builds the job SINGA's binding built.

Differences, all on purpose: an argument no part of the layer takes raises ArgumentError naming the
layer and the argument (the binding ignored it), ``Dropout`` works (the binding's used an undefined
name), and ``RBM`` makes its hidden half (the binding passed the name twice and failed).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from singa_mpi.api.fields import ArgumentError
from singa_mpi.compat.singa_v03.names import generate_name
from singa_mpi.compat.singa_v03.parameter import PARAM_ARGUMENTS, Parameter, set_param_field
from singa_mpi.compat.singa_v03.protos import (LAYER_FIELDS, check_arguments, fields_of, init_method, layer_type, only,
                                               setval)
from singa_mpi.compat.singa_v03.protos import phase as phase_value
from singa_mpi.proto import job_pb2

ACTIVATIONS = ("relu", "sigmoid", "tanh", "stanh", "softmax")
STORE_FIELDS = fields_of(job_pb2.StoreProto)


class Layer:
    """A layer of any type: ``Layer(name=..., type=job_pb2.kReLU, ...)`` with LayerProto's fields as
    arguments (``partition_dim``, ``location``, ...); unnamed, it is ``layer<n>``."""

    is_datalayer = False
    mask: job_pb2.LayerProto | None = None      # the activation the binding adds after it
    bidirect: job_pb2.LayerProto | None = None  # an RBM's hidden half

    def __init__(self, **kwargs: Any):
        name = kwargs.pop("name", None) or generate_name("layer", 1)
        self._setup(name, kwargs)

    def _setup(self, name: str, kwargs: dict[str, Any], takes: Iterable[str] = (), **fields: Any) -> None:
        """The LayerProto ``name``d, with ``fields`` and ``kwargs``' LayerProto fields; the rest of
        ``kwargs`` must be in ``takes`` (what the subclass uses itself)."""
        self.where = f"layer {name!r} ({type(self).__name__})"
        check_arguments(self.where, kwargs, LAYER_FIELDS | {"src"} | set(takes))
        self.layer = job_pb2.LayerProto()
        setval(self.layer, self.where, name=name, **fields, **only(kwargs, LAYER_FIELDS - {"name"}))
        self.src = kwargs.get("src")

    def _positive(self, argument: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ArgumentError(f"{self.where}: argument {argument} = {value!r}: expected a positive integer")

    def _params(self, w_param: Parameter | None, b_param: Parameter | None, init: str | None, changename: bool,
                kwargs: dict[str, Any], defaults: tuple[str, str] = ("gaussian", "constant")) -> None:
        """The weight and bias params: given ones, else the ``init`` kind (the defaults: gaussian
        weights, constant biases), with the layer's ``w_``/``b_`` arguments."""
        if init is not None and init != "none":
            init_method(init, self.where)  # named as the layer's argument, not as a param it would make
        for given, pname, default in ((w_param, "w", defaults[0]), (b_param, "b", defaults[1])):
            if given is not None and not isinstance(given, Parameter):
                raise ArgumentError(f"{self.where}: argument {pname}_param = {given!r}: expected a Parameter(...)")
            param = given if given is not None else Parameter(init=init or default)
            if param.given_as is not None and not changename:  # its param keeps the name it got then
                raise ArgumentError(f"{self.where}: argument {pname}_param: the Parameter (param {param.param.name!r}) "
                                    f"given as {param.given_as}: expected a Parameter(...) of its own (one "
                                    f"Parameter given twice makes two params named {param.param.name!r})")
            set_param_field(param.param, pname, changename, where=self.where, **kwargs)
            setval(self.layer, self.where, param=param.param)
            param.given_as = f"layer {self.layer.name!r}'s {pname}_param"

    def _activation(self, activation: str | None) -> None:
        if activation:
            check_activation(activation, self.where)
            self.mask = Activation(activation=activation).layer

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.layer.name!r})"


def check_activation(activation: Any, where: str) -> None:
    if activation not in ACTIVATIONS:
        raise ArgumentError(f"{where}: argument activation = {activation!r}: expected one of {', '.join(ACTIVATIONS)}")


class Data(Layer):
    """An input layer: ``load`` its type without ``k`` in lower case (``'recordinput'``), ``phase``
    ``'train'``/``'test'``/``'val'``, ``conf`` a :class:`~singa_mpi.compat.singa_v03.model.Store` (or its
    fields as arguments), ``checkpoint`` the checkpoints a training job starts from."""

    is_datalayer = True

    def __init__(self, load: str, phase: str = "train", checkpoint: list[str] | None = None, conf: Any = None,
                 **kwargs: Any):
        name = generate_name("data")
        if load == "kData":
            raise ArgumentError(f"layer {name!r} (Data): argument load = 'kData': Rafiki's user data layer is not "
                                "supported: expected a layer type such as 'recordinput'")
        self._setup(name, kwargs, STORE_FIELDS if conf is None else ())
        if conf is not None and not isinstance(getattr(conf, "proto", None), job_pb2.StoreProto):
            raise ArgumentError(f"{self.where}: argument conf = {conf!r}: expected a Store(...)")
        setval(self.layer, self.where, type=layer_type(load, self.where), include=phase_value(phase, self.where))
        if conf is None:
            setval(self.layer.store_conf, self.where, **only(kwargs, STORE_FIELDS - LAYER_FIELDS))
        else:
            setval(self.layer, self.where, store_conf=conf.proto)
        self.checkpoint = checkpoint


def _pairs(prefix: str, value: int | Sequence[int], where: str, low: int = 1) -> dict[str, int]:
    """``kernel=5`` or ``kernel_x=5, kernel_y=3`` from an int or a pair (each at least ``low``)."""
    values = [value] if isinstance(value, int) and not isinstance(value, bool) else (
        list(value) if isinstance(value, (tuple, list)) and len(value) == 2 else None)
    if values is None or any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
        kind = "a positive integer" if low > 0 else "an integer >= 0"
        pair = "" if isinstance(value, int) and not isinstance(value, bool) else " or a pair of them"
        raise ArgumentError(f"{where}: argument {prefix} = {value!r}: expected {kind}{pair}")
    if len(values) == 1:
        return {prefix: values[0]}
    return {prefix + "_x": values[0], prefix + "_y": values[1]}


class Convolution2D(Layer):
    """A convolution (kCConvolution): ``nb_filter`` filters of ``kernel`` (int or pair), ``stride``,
    ``pad``; weights gaussian (std 0.01) and biases 0 unless ``init``/``w_param``/``b_param`` or
    ``w_std``, ``b_lr``, ... say otherwise; ``activation`` adds an activation layer after it."""

    def __init__(self, nb_filter: int = 0, kernel: int | Sequence[int] = 0, stride: int | Sequence[int] = 1,
                 pad: int | Sequence[int] = 0, init: str | None = None, w_param: Parameter | None = None,
                 b_param: Parameter | None = None, activation: str | None = None, **kwargs: Any):
        self._setup(generate_name("conv", 1), kwargs, PARAM_ARGUMENTS, type=job_pb2.kCConvolution)
        self._positive("nb_filter", nb_filter)
        conf = {"num_filters": nb_filter, **_pairs("kernel", kernel, self.where),
                **_pairs("stride", stride, self.where), **_pairs("pad", pad, self.where, low=0)}
        setval(self.layer.convolution_conf, self.where, **conf)
        self._params(w_param, b_param, init, True, kwargs)
        self._activation(activation)


class _Pooling2D(Layer):
    METHOD = job_pb2.PoolingProto.MAX

    def __init__(self, pool_size: int | tuple[int, int] | None = None, stride: int = 1, ignore_border: bool = True,
                 **kwargs: Any):
        self._setup(generate_name("pool"), kwargs, type=job_pb2.kCPooling)
        size = (pool_size, pool_size) if isinstance(pool_size, int) else pool_size
        if not isinstance(size, tuple) or len(size) != 2 or size[0] != size[1]:
            raise ArgumentError(f"{self.where}: argument pool_size = {pool_size!r}: expected an int or a square pair "
                                "(SINGA pools square windows)")
        self._positive("pool_size", size[0])
        self._positive("stride", stride)
        setval(self.layer.pooling_conf, self.where, pool=self.METHOD, kernel=size[0], stride=stride,
               pad=0 if ignore_border else 1)


class MaxPooling2D(_Pooling2D):
    """Max pooling (kCPooling) over square windows of ``pool_size``, ``stride`` apart."""


class AvgPooling2D(_Pooling2D):
    """Average pooling (kCPooling) over square windows of ``pool_size``, ``stride`` apart."""

    METHOD = job_pb2.PoolingProto.AVG


class LRN2D(Layer):
    """Local response normalisation across ``size`` channels: ``alpha`` (binding's default 1),
    ``beta`` (0.75), ``knorm`` (1)."""

    def __init__(self, size: int = 0, **kwargs: Any):
        self._setup(generate_name("norm"), kwargs, {"alpha", "beta", "knorm"}, type=job_pb2.kLRN)
        self._positive("size", size)
        values = {"alpha": kwargs.get("alpha", 1), "beta": kwargs.get("beta", 0.75), "knorm": kwargs.get("knorm", 1)}
        setval(self.layer.lrn_conf, self.where, local_size=size, **values)


class Loss(Layer):
    """A loss layer: ``lossname`` ``'softmaxloss'`` (with ``topk``) or ``'euclideanloss'``."""

    def __init__(self, lossname: str, topk: int = 1, **kwargs: Any):
        self._setup(generate_name(lossname), kwargs)
        setval(self.layer, self.where, type=layer_type(lossname, self.where, "lossname"))
        self._positive("topk", topk)
        if lossname == "softmaxloss":
            self.layer.softmaxloss_conf.topk = topk


class Activation(Layer):
    """An activation: ``'relu'``, ``'sigmoid'``, ``'tanh'`` (kActivation of that kind), ``'stanh'``
    (kSTanh, scaled tanh) or ``'softmax'`` (kSoftmax: made the softmax loss by ``compile``)."""

    def __init__(self, activation: str = "stanh", **kwargs: Any):
        check_activation(activation, "Activation")
        kind = {"stanh": job_pb2.kSTanh, "softmax": job_pb2.kSoftmax}.get(activation, job_pb2.kActivation)
        self.layer_type = kind
        self._setup(generate_name(activation), kwargs, type=kind)
        if kind == job_pb2.kActivation:
            self.layer.activation_conf.type = job_pb2.ActivationProto.ActivationType.Value(activation.upper())


class Dropout(Layer):
    """Dropout of a ``ratio`` of the units in training."""

    def __init__(self, ratio: float = 0.5, **kwargs: Any):
        self._setup(generate_name("dropout"), kwargs, type=job_pb2.kDropout)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            raise ArgumentError(f"{self.where}: argument ratio = {ratio!r}: expected a number in [0, 1)")
        self.layer.dropout_conf.dropout_ratio = ratio


class Accuracy(Layer):
    """The accuracy of its scores against the labels (``evaluate(..., show_acc=True)`` adds one)."""

    def __init__(self, **kwargs: Any):
        self._setup(generate_name("accuracy"), kwargs, type=job_pb2.kAccuracy)


class RGB(Layer):
    """SINGA's RGB image parser (kRGBImage) with a ``meanfile``."""

    def __init__(self, meanfile: str | None = None, **kwargs: Any):
        self._setup(generate_name("rgb"), kwargs, type=job_pb2.kRGBImage)
        if not meanfile:
            raise ArgumentError(f"{self.where}: argument meanfile: expected the path of the mean file")
        self.layer.rgbimage_conf.meanfile = meanfile


class Dense(Layer):
    """A fully connected layer (kInnerProduct) of ``output_dim`` units; weights gaussian (std 0.01)
    and biases 0 unless ``init`` (``'uniform'``: ±0.05), ``w_param``/``b_param`` or ``w_lr``,
    ``b_wd``, ``w_std``, ... say otherwise; ``transpose`` uses the weight transposed (a shared
    decoder); ``activation`` adds an activation layer after it."""

    def __init__(self, output_dim: int = 0, activation: str | None = None, init: str | None = None,
                 w_param: Parameter | None = None, b_param: Parameter | None = None, input_dim: int | None = None,
                 **kwargs: Any):
        name = kwargs.pop("name", None) or generate_name("layer", 1)
        self._setup(name, kwargs, PARAM_ARGUMENTS | {"transpose"}, type=job_pb2.kInnerProduct)
        self._positive("output_dim", output_dim)
        setval(self.layer.innerproduct_conf, self.where, num_output=output_dim)
        if "transpose" in kwargs:
            setval(self.layer.innerproduct_conf, self.where, transpose=kwargs["transpose"])
        self._params(w_param, b_param, init, False, kwargs)
        self._activation(activation)


class Autoencoder:
    """A stack of Dense layers that ``Sequential.add`` unfolds: encoders of ``hid_dim`` units and
    decoders back to ``out_dim``, the decoders using the encoders' weights transposed when
    ``param_share`` (else an MLP of ``hid_dim`` then ``out_dim``)."""

    layer_type = "AutoEncoder"

    def __init__(self, hid_dim: int | Sequence[int] | None = None, out_dim: int = 0, activation: str | None = None,
                 param_share: bool = True):
        where = "Autoencoder"
        if isinstance(out_dim, bool) or not isinstance(out_dim, int) or out_dim <= 0:
            raise ArgumentError(f"{where}: argument out_dim = {out_dim!r}: expected a positive integer")
        if hid_dim is None:
            raise ArgumentError(f"{where}: argument hid_dim: expected the hidden layers' sizes")
        self.hid_dim = [hid_dim] if isinstance(hid_dim, int) else list(hid_dim)
        if not self.hid_dim or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in self.hid_dim):
            raise ArgumentError(f"{where}: argument hid_dim = {hid_dim!r}: expected positive integers")
        if activation is not None:
            check_activation(activation, where)
        self.out_dim, self.activation, self.param_share = out_dim, activation, param_share


class RBM(Layer):
    """A restricted Boltzmann machine of ``out_dim`` hidden units (a list: a stack, whose lower
    levels ``Energy.add`` unfolds into sigmoid Dense layers with the lower RBMs' params): the visible
    half (kRBMVis, weights gaussian std 0.01 unless ``w_std``...) and its hidden half (kRBMHid,
    ``bidirect``: the weights shared, its own bias), ``sampling='gaussian'`` for gaussian hidden units."""

    def __init__(self, out_dim: int | Sequence[int] | None = None, w_param: Parameter | None = None,
                 b_param: Parameter | None = None, sampling: str | None = None, **kwargs: Any):
        name = kwargs.pop("name", "RBMVis")
        kind = kwargs.pop("type", job_pb2.kRBMVis)
        self.layer_type = kind
        self._setup(generate_name(name, withnumber=False), kwargs, PARAM_ARGUMENTS, type=kind)
        dims = [out_dim] if isinstance(out_dim, int) else list(out_dim or [])
        if not dims:
            raise ArgumentError(f"{self.where}: argument out_dim: expected the hidden units (an int or a list)")
        for dim in dims:
            self._positive("out_dim", dim)
        if sampling not in (None, "gaussian"):
            raise ArgumentError(f"{self.where}: argument sampling = {sampling!r}: expected None or 'gaussian'")
        self.out_dim = dims
        setval(self.layer.rbm_conf, self.where, hdim=dims[-1])
        if kind == job_pb2.kRBMHid and sampling == "gaussian":
            self.layer.rbm_conf.gaussian = True
        level = len(dims)
        weight = w_param if w_param is not None else Parameter(init="gaussian")
        bias = b_param if b_param is not None else Parameter(init="constant")
        if kind != job_pb2.kRBMHid:  # the hidden half's params come made (named after the visible's)
            set_param_field(weight.param, "w", withnumber=False, where=self.where, level=level, **kwargs)
            set_param_field(bias.param, "b", withnumber=False, where=self.where, level=level, **kwargs)
        setval(self.layer, self.where, param=[weight.param, bias.param])
        if kind == job_pb2.kRBMVis:
            shared = Parameter(name=weight.param.name + "_", init="none", share_from=weight.param.name)
            hidden_bias = Parameter(name=bias.param.name + "2", wd=0, init="constant")
            self.bidirect = RBM(dims, name="RBMHid", type=job_pb2.kRBMHid, w_param=shared, b_param=hidden_bias,
                                sampling=sampling).layer


__all__ = ["Layer", "Data", "Convolution2D", "MaxPooling2D", "AvgPooling2D", "LRN2D", "Loss", "Activation", "Dropout",
           "Accuracy", "RGB", "Dense", "Autoencoder", "RBM", "ACTIVATIONS"]
