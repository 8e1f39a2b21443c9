"""SINGA 0.3 binding's ``Parameter`` and the ``w_``/``b_`` arguments of its layers.

``Parameter(init='uniform', scale=0.05, lr=2, wd=0)`` is a ParamProto: ``lr``/``wd`` its learning
rate and weight decay multipliers, ``init`` its initialisation with the binding's defaults (uniform in
±0.05, gaussian of std 0.01, constant 0; ``'none'``: no init, the values come from a checkpoint).  A
layer's ``w_lr=2, b_wd=0, w_std=1e-4`` set its weight's or bias's multipliers and init fields.
"""
from __future__ import annotations

from typing import Any

from singa_mpi.api.fields import ArgumentError, set_field
from singa_mpi.compat.singa_v03.names import generate_name
from singa_mpi.compat.singa_v03.protos import INIT_FIELDS, check_arguments, init_method, setval
from singa_mpi.proto import job_pb2

PARAMETER_ARGUMENTS = {"name", "lr", "wd", "init", "value", "scale", "low", "high", "mean", "std", "level",
                       "share_from"}
# what the binding's layers take for their weight (w_) and bias (b_): multipliers and init fields
PARAM_PREFIXES = ("w_", "b_")
PARAM_ARGUMENTS = {prefix + name for prefix in PARAM_PREFIXES for name in {"lr", "wd"} | INIT_FIELDS - {"type"}}


def init_values(kind: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An init kind's fields: the binding's defaults unless ``arguments`` gives them."""
    if kind == "uniform":
        scale = arguments.get("scale", 0.05)
        return {"low": arguments.get("low", -scale), "high": arguments.get("high", scale)}
    if kind == "constant":
        return {"value": arguments.get("value", 0)}
    if kind == "gaussian":
        return {"mean": arguments.get("mean", 0), "std": arguments.get("std", 0.01)}
    return {}  # the fan-in kinds: their type alone


class Parameter:
    """A param (``param`` holds its ParamProto): ``name`` (else ``param<n>``; with ``level`` the RBM
    stack's ``w<level>``/``b<level>2``), ``lr``/``wd`` multipliers, ``init`` one of ``uniform``
    (``scale`` or ``low``/``high``), ``gaussian`` (``mean``, ``std``), ``constant`` (``value``), the
    fan-in kinds or ``none``; without ``init``: uniform in [-1, 1]; ``share_from`` a param's name."""

    def __init__(self, **kwargs: Any):
        check_arguments("Parameter", kwargs, PARAMETER_ARGUMENTS)
        self.param = job_pb2.ParamProto()
        self.given_as: str | None = None  # "layer 'layer1''s w_param": a layer's param was made of it
        given = f"Parameter {kwargs['name']!r}" if "name" in kwargs else "Parameter"  # as the script wrote it
        set_multipliers(self.param, given, kwargs.get("lr", 1), kwargs.get("wd", 1), "lr", "wd")
        if "name" not in kwargs:
            name = generate_name("param", 1)
        else:
            name = kwargs["name"]
            if "level" in kwargs:  # the RBM stack's names: w1, b12 (a hidden layer's bias)
                name += str(kwargs["level"])
                if name.startswith("b"):
                    name += "2"
        setval(self.param, given, name=name)
        if "share_from" in kwargs:
            setval(self.param, given, share_from=kwargs["share_from"])
        if "init" not in kwargs:  # the binding's default: uniform, in the schema's [-1, 1]
            self.param.init.type = init_method("uniform", given)
        elif kwargs["init"] != "none":
            self.param.init.type = init_method(kwargs["init"], given)
            set_init(self.param.init, given, init_values(kwargs["init"], kwargs), "")

    def update(self, **fields: Any) -> None:
        """Set fields of the param or of its init, whichever has them."""
        for key, value in fields.items():
            if key in job_pb2.ParamProto.DESCRIPTOR.fields_by_name:
                setval(self.param, f"Parameter {self.param.name!r}", **{key: value})
            elif key in INIT_FIELDS:
                setval(self.param.init, f"Parameter {self.param.name!r}", **{key: value})
            else:
                raise ArgumentError(f"Parameter {self.param.name!r}: unknown argument {key}: expected a field of "
                                    "ParamProto or ParamGenProto")


def set_multipliers(param: job_pb2.ParamProto, where: str, lr: Any, wd: Any, lr_name: str, wd_name: str) -> None:
    """The param's learning-rate and weight-decay multipliers, an error naming the argument the
    script wrote (``lr``, ``w_lr``, ...) rather than the field (``lr_scale``)."""
    fields = param.DESCRIPTOR.fields_by_name
    set_field(param, fields["lr_scale"], lr, where, lr_name)
    set_field(param, fields["wd_scale"], wd, where, wd_name)


def set_init(init: job_pb2.ParamGenProto, where: str, values: dict[str, Any], prefix: str) -> None:
    """Init fields from ``values``, an error naming the argument as written (``prefix`` + field: ``w_std``)."""
    fields = init.DESCRIPTOR.fields_by_name
    for key, value in values.items():
        set_field(init, fields[key], value, where, prefix + key)


def set_param_field(param: job_pb2.ParamProto, pname: str, changename: bool = False, withnumber: bool = True,
                    where: str | None = None, **kwargs: Any) -> None:
    """A layer's weight (``pname`` 'w') or bias ('b') from the layer's arguments: ``w_lr``/``w_wd``
    its multipliers, other ``w_*`` its init fields (``w_std``); it is named ``w<n>`` (``b<n>``) when
    ``changename`` or while it has a generated ``param<n>`` name (``level``: the RBM stack's).  A bad
    value names the layer (``where``) and its argument (``w_lr``)."""
    prefix = pname + "_"
    lr_scale, wd_scale = kwargs.get(prefix + "lr", param.lr_scale), kwargs.get(prefix + "wd", param.wd_scale)
    init = {key[2:]: value for key, value in kwargs.items()
            if key.startswith(prefix) and key not in (prefix + "lr", prefix + "wd")}
    where = where or f"Parameter {param.name!r}"
    if param.name.startswith("param") or changename:
        label = pname + str(kwargs["level"]) if "level" in kwargs else pname
        setval(param, where, name=generate_name(label, withnumber=withnumber))
    set_multipliers(param, where, lr_scale, wd_scale, prefix + "lr", prefix + "wd")
    if init:
        set_init(param.init, where, init, prefix)


__all__ = ["Parameter", "set_param_field", "set_multipliers", "set_init", "init_values", "PARAM_ARGUMENTS"]
