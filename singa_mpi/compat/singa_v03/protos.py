"""Setting the job's messages the way SINGA 0.3's binding did, with errors instead of silence.

The binding's ``setval`` appended to repeated fields (a layer's ``param``, ``srclayers``,
``include``), merged nested messages and skipped any key the message lacks, which let a mistyped
argument pass unnoticed.  :func:`setval` appends and merges the same way, and a key no message of the
call takes raises :class:`~singa_mpi.api.fields.ArgumentError` naming the class and the argument.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from singa_mpi.api.fields import ArgumentError, set_field
from singa_mpi.proto import job_pb2


def setval(message: Message, where: str, **values: Any) -> Message:
    """Set ``message``'s fields from ``values`` (repeated fields appended to, messages merged)."""
    fields = message.DESCRIPTOR.fields_by_name
    for key, value in values.items():
        field = fields.get(key)
        if field is None:
            raise ArgumentError(f"{where}: unknown argument {key}: expected one of {', '.join(sorted(fields))}")
        if field.is_repeated:
            items = list(value) if isinstance(value, (list, tuple)) else [value]
            if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                for item in items:
                    getattr(message, key).add().MergeFrom(item)
            else:
                set_field(message, field, list(getattr(message, key)) + items, where, key)
        elif field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            getattr(message, key).MergeFrom(value)
        else:
            set_field(message, field, value, where, key)
    return message


def check_arguments(where: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    """ArgumentError for the first of ``given`` that is not ``allowed`` (the binding ignored it)."""
    allowed = set(allowed)
    for key in given:
        if key not in allowed:
            expected = f"one of {', '.join(sorted(allowed))}" if allowed else "no other argument"
            raise ArgumentError(f"{where}: unknown argument {key}: expected {expected}")


def fields_of(message_type: Any) -> set[str]:
    return set(message_type.DESCRIPTOR.fields_by_name)


def only(values: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """The items of ``values`` whose keys are in ``names``."""
    names = set(names)
    return {key: value for key, value in values.items() if key in names}


def _enum(enum_name: str, key: str, what: str, where: str) -> int:
    """The binding's ``enum<Type>(key)``: a value by its name, lower-case and without its ``k``
    (``enumLayerType('softmaxloss')`` is kSoftmaxLoss)."""
    values = job_pb2.DESCRIPTOR.enum_types_by_name[enum_name].values
    by_key = {value.name[1:].lower(): value.number for value in values}
    if key not in by_key:
        raise ArgumentError(f"{where}: argument {what} = {key!r}: expected one of {', '.join(sorted(by_key))}")
    return by_key[key]


def layer_type(key: str, where: str, what: str = "load") -> int:
    return _enum("LayerType", key, what, where)


def phase(key: str, where: str) -> int:
    return _enum("Phase", key, "phase", where)


def init_method(key: str, where: str) -> int:
    return _enum("InitMethod", key, "init", where)


def algorithm(key: str, where: str) -> int:
    return _enum("AlgType", key, "alg", where)


LAYER_FIELDS = fields_of(job_pb2.LayerProto)
INIT_FIELDS = fields_of(job_pb2.ParamGenProto)

__all__ = ["setval", "check_arguments", "fields_of", "only", "layer_type", "phase", "init_method", "algorithm",
           "LAYER_FIELDS", "INIT_FIELDS"]
