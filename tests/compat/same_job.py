"""Two jobs compared as singa_mpi reads them, blind to what does not change the training: the names
of layers and params (renamed by position), explicit default values, the order of the input layers,
and kActivation of kind RELU / SIGMOID against kReLU / kSigmoid (the project builds one layer class
for both: tests/compat/test_singa_v03.py checks that)."""
from __future__ import annotations

import re
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from singa_mpi.proto import job_pb2

PHASES = {job_pb2.kTrain: "train", job_pb2.kTest: "test", job_pb2.kVal: "val"}
SAME_AS_ACTIVATION = {job_pb2.ActivationProto.RELU: job_pb2.kReLU, job_pb2.ActivationProto.SIGMOID: job_pb2.kSigmoid}


def differences(one: job_pb2.JobProto, other: job_pb2.JobProto) -> dict[str, tuple[Any, Any]]:
    """field path -> (one's value, other's value) where the two jobs differ."""
    mine, theirs = _flat(_canonical(one)), _flat(_canonical(other))
    found = {path: (mine.get(path), theirs.get(path)) for path in sorted(set(mine) | set(theirs))
             if mine.get(path) != theirs.get(path)}
    # a layer only one job has: one entry (its type), not one per field
    alone = {path[:-len(".type")] for path, (a, b) in found.items()
             if re.fullmatch(r"neuralnet\.layer\[[^]]*\]\.type", path) and (a is None or b is None)}
    return {path: values for path, values in found.items()
            if not any(path.startswith(layer + ".") for layer in alone) or path in {f"{a}.type" for a in alone}}


def _canonical(job: job_pb2.JobProto) -> job_pb2.JobProto:
    job = _copy(job)
    layers, params = {}, {}
    for layer in job.neuralnet.layer:
        if layer.type == job_pb2.kActivation and layer.activation_conf.type in SAME_AS_ACTIVATION:
            layer.type = SAME_AS_ACTIVATION[layer.activation_conf.type]
            layer.ClearField("activation_conf")
        if layer.HasField("store_conf"):
            layers[layer.name] = "input"
        else:
            layers[layer.name] = f"L{sum(1 for name in layers.values() if name != 'input') + 1}"
        for param in layer.param:
            params.setdefault(param.name, f"P{len(params) + 1}")
    for layer in job.neuralnet.layer:
        layer.name = layers[layer.name]
        sources = [layers.get(name, name) for name in layer.srclayers]
        del layer.srclayers[:]
        layer.srclayers.extend(sources)
        for param in layer.param:
            param.name = params[param.name]
            if param.share_from:
                param.share_from = params.get(param.share_from, param.share_from)
    _fill_defaults(job)
    return job


def _copy(job: job_pb2.JobProto) -> job_pb2.JobProto:
    copy = job_pb2.JobProto()
    copy.CopyFrom(job)
    return copy


def _fill_defaults(message: Message) -> None:
    for field in message.DESCRIPTOR.fields:
        if field.is_repeated:
            if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                for item in getattr(message, field.name):
                    _fill_defaults(item)
        elif field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            if message.HasField(field.name):
                _fill_defaults(getattr(message, field.name))
        elif not message.HasField(field.name):
            setattr(message, field.name, field.default_value)


def _flat(message: Message, prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for field, value in message.ListFields():
        path = prefix + field.name
        if field.cpp_type != FieldDescriptor.CPPTYPE_MESSAGE:
            found[path] = tuple(value) if field.is_repeated else value
        elif not field.is_repeated:
            found.update(_flat(value, path + "."))
            found.setdefault(path, "{}")  # an empty block is a block
        else:
            for index, item in enumerate(value):
                found.update(_flat(item, f"{path}[{_key(item, index)}]."))
    return found


def _key(item: Message, index: int) -> str:
    """A layer by its canonical name (inputs by phase), anything else by its place."""
    if isinstance(item, job_pb2.LayerProto):
        if item.name == "input":
            return "input:" + "+".join(PHASES.get(p, str(p)) for p in item.include)
        return item.name
    return str(index)
