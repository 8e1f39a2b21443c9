"""Plain Python arguments into protobuf messages, with errors that name the part and the argument.

Every object of the Python API is a view of one message of ``singa_mpi/proto/job.proto`` (a layer
of a ``LayerProto``, an updater of an ``UpdaterProto``, ...), so that a job built in Python is the job
a ``.conf`` file describes, field for field.  :func:`fill` sets a message's fields from keyword
arguments named as the proto names them: nested messages from dicts (or API objects, or messages),
repeated fields from lists, enums from their names.  What it cannot set raises
:class:`ArgumentError`, one line naming where (``layer 'fc1' (kInnerProduct)``), the argument and what
was expected.
"""
from __future__ import annotations

import numbers
from typing import Any, Mapping, TypeGuard

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from singa_mpi.errors import ConfigError

_KINDS = {FieldDescriptor.CPPTYPE_INT32: "an integer", FieldDescriptor.CPPTYPE_INT64: "an integer",
          FieldDescriptor.CPPTYPE_UINT32: "a non-negative integer",
          FieldDescriptor.CPPTYPE_UINT64: "a non-negative integer", FieldDescriptor.CPPTYPE_FLOAT: "a number",
          FieldDescriptor.CPPTYPE_DOUBLE: "a number", FieldDescriptor.CPPTYPE_BOOL: "True or False",
          FieldDescriptor.CPPTYPE_STRING: "a string"}


class ArgumentError(ConfigError, ValueError):
    """A bad argument of a job built in Python: one line naming the layer (or the job's part), the
    argument, the value and what was expected.  A ``ConfigError`` (the CLI's exit code 2) and a
    ``ValueError``."""


def is_number(value: Any) -> TypeGuard[float]:
    """A real number as the API takes one: Python's or numpy's (``np.float32(0.1)``), never a bool
    (True is an int to Python, but no script means it as 1)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_integer(value: Any) -> TypeGuard[int]:
    """A whole number as the API takes one: Python's or numpy's (``np.int64``), never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class ProtoView:
    """An API object that is a view of one message (``proto``): built from a copy of a message
    (:meth:`from_proto`: a ``.conf`` file read into objects), the message itself to write."""

    proto: Any

    @classmethod
    def from_proto(cls, proto: Message) -> Any:
        view = cls.__new__(cls)
        view.proto = type(proto)()
        view.proto.CopyFrom(proto)
        return view

    def to_proto(self) -> Any:
        return self.proto


def fill(message: Message, values: Mapping[str, Any], where: str, path: str = "") -> Message:
    """Set ``message``'s fields from ``values`` (None: left unset); returns ``message``.  ``where``
    names the part (``layer 'fc1' (kInnerProduct)``), ``path`` the block inside it (``innerproduct_conf.``)."""
    fields = message.DESCRIPTOR.fields_by_name
    for key, value in values.items():
        if value is None:
            continue
        field = fields.get(key)
        if field is None:
            raise ArgumentError(f"{where}: unknown argument {path}{key}: expected one of "
                                f"{', '.join(path + name for name in sorted(fields))}")
        set_field(message, field, value, where, path + key)
    return message


def set_field(message: Message, field: FieldDescriptor, value: Any, part: str, argument: str) -> None:
    """One field of ``message`` from ``value`` (replacing what it held)."""
    where = f"{part}: argument {argument}"
    if field.is_repeated:
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise ArgumentError(f"{where} = {value!r}: expected a list")
        target = getattr(message, field.name)
        del target[:]
        for index, item in enumerate(value):
            if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                _merge(target.add(), item, part, f"{argument}[{index}]")
            else:
                target.append(_scalar(field, item, f"{where}[{index}]"))
        return
    if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
        inner = getattr(message, field.name)
        inner.Clear()
        inner.SetInParent()  # an empty block is a block (`euclideanloss_conf {}`)
        _merge(inner, value, part, argument)
        return
    setattr(message, field.name, _scalar(field, value, where))


def _merge(target: Message, value: Any, part: str, argument: str) -> None:
    """A nested message from a dict, an API object (``to_proto()``) or a message of its type."""
    where = f"{part}: argument {argument}"
    if hasattr(value, "to_proto"):
        value = value.to_proto()
    if isinstance(value, Message):
        if value.DESCRIPTOR is not target.DESCRIPTOR:
            raise ArgumentError(f"{where}: expected a {target.DESCRIPTOR.name}, got a {value.DESCRIPTOR.name}")
        target.CopyFrom(value)
    elif isinstance(value, Mapping):
        fill(target, value, part, argument + ".")
    else:
        raise ArgumentError(f"{where} = {value!r}: expected a dict of {target.DESCRIPTOR.name}'s fields")


def _scalar(field: FieldDescriptor, value: Any, where: str) -> Any:
    if field.cpp_type == FieldDescriptor.CPPTYPE_ENUM:
        names = field.enum_type.values_by_name
        if isinstance(value, str) and value in names:
            return names[value].number
        if is_integer(value) and int(value) in field.enum_type.values_by_number:
            return value
        raise ArgumentError(f"{where} = {value!r}: expected one of {', '.join(names)}")
    if field.cpp_type == FieldDescriptor.CPPTYPE_BOOL:
        if not isinstance(value, bool):
            raise ArgumentError(f"{where} = {value!r}: expected True or False")
        return value
    if field.cpp_type in (FieldDescriptor.CPPTYPE_FLOAT, FieldDescriptor.CPPTYPE_DOUBLE):
        if not is_number(value):
            raise ArgumentError(f"{where} = {value!r}: expected a number")
        return float(value)
    if field.cpp_type == FieldDescriptor.CPPTYPE_STRING:
        if not isinstance(value, str):
            raise ArgumentError(f"{where} = {value!r}: expected a string")
        return value
    if not is_integer(value):
        raise ArgumentError(f"{where} = {value!r}: expected {_KINDS[field.cpp_type]}")
    value = int(value)
    bits = 32 if field.cpp_type in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_UINT32) else 64
    low = 0 if field.cpp_type in (FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64) else -2 ** (bits - 1)
    high = 2 ** bits - 1 if low == 0 else 2 ** (bits - 1) - 1
    if not low <= value <= high:
        raise ArgumentError(f"{where} = {value!r}: expected {_KINDS[field.cpp_type]} that fits {bits} bits")
    return value


__all__ = ["ArgumentError", "ProtoView", "fill", "set_field", "is_number", "is_integer"]
