"""Nets of the Python API: a graph of layers (:class:`Net`) or a chain (:class:`Sequential`), a view of
the job's ``NetProto``."""
from __future__ import annotations

from typing import Any, Iterator, Sequence

from singa_mpi.api.fields import ArgumentError, fill
from singa_mpi.api.layers import Layer, _partition_dim
from singa_mpi.proto import job_pb2


PARAM_ROLES = ("w", "b")  # what a layer's first params are, for their names (fc1_w, fc1_b)


class Net:
    """A graph of layers, each naming the layers it reads (``srcs``), in the order they run; the
    net's own settings: ``partition_dim`` (every layer's that does not say: -1, 0, 1 or ``"auto"``),
    ``pipeline`` (``{"micro_batches": 4, "schedule": "1f1b"}``) and any other NetProto field."""

    def __init__(self, layers: Sequence[Layer] = (), *, partition_dim: int | str | None = None,
                 pipeline: dict[str, Any] | None = None, **more: Any):
        self.settings = fill(job_pb2.NetProto(), dict(partition_dim=_partition_dim(partition_dim, "net"),
                                                      pipeline=pipeline, **more), "net")
        if self.settings.layer:
            raise ArgumentError("net: argument layer: expected the layers as Net(layers=[...]) or net.add(layer)")
        self.layers: list[Layer] = []
        if isinstance(layers, Layer) or not hasattr(layers, "__iter__"):
            raise ArgumentError(f"net: argument layers = {layers!r}: expected a list of layers")
        for layer in layers:
            self.add(layer)

    def add(self, layer: Layer) -> Layer:
        """Append ``layer`` (named ``<type><n>`` when it has no name, its unnamed params after it);
        returns it."""
        if not isinstance(layer, Layer):
            raise ArgumentError(f"net: add({layer!r}): expected a Layer")
        if not layer.name:
            layer.proto.name = self._fresh_name(layer)
        for index, param in enumerate(layer.proto.param):
            if not param.name and not param.share_from:
                param.name = f"{layer.name}_{PARAM_ROLES[index] if index < len(PARAM_ROLES) else index}"
        self.connect(layer)
        self.layers.append(layer)
        return layer

    def connect(self, layer: Layer) -> None:
        """A graph's layers name their sources themselves."""

    def _fresh_name(self, layer: Layer) -> str:
        stem = layer.type[1:].lower() if layer.type.startswith("k") else layer.type.lower()
        taken = {other.name for other in self.layers}
        count = 1
        while f"{stem}{count}" in taken:
            count += 1
        return f"{stem}{count}"

    def __getitem__(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"no layer {name!r} in the net: expected one of {', '.join(dict.fromkeys(self.names()))}")

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def names(self) -> list[str]:
        """The layers' names, in the order they were added."""
        return [layer.name for layer in self.layers]

    def to_proto(self) -> job_pb2.NetProto:
        """The NetProto: the layers' messages in order, and the net's own settings."""
        proto = job_pb2.NetProto()
        proto.CopyFrom(self.settings)
        proto.layer.extend(layer.to_proto() for layer in self.layers)
        return proto

    @classmethod
    def from_proto(cls, proto: job_pb2.NetProto) -> Net:
        """A net from a NetProto (copied): each layer a :class:`~singa_mpi.api.layers.Layer`."""
        net = cls.__new__(cls)
        net.settings = job_pb2.NetProto()
        net.settings.CopyFrom(proto)
        del net.settings.layer[:]
        net.layers = [Layer.from_proto(layer) for layer in proto.layer]
        return net

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self.names())})"


class Sequential(Net):
    """A chain: a layer added without ``srcs`` reads the layer added before it (an input layer reads
    nothing; a train and a test input of one name stand for one source)."""

    def connect(self, layer: Layer) -> None:
        if layer.srcs or _is_input(layer) or not self.layers:
            return
        layer.proto.srclayers.append(self.layers[-1].name)


def _is_input(layer: Layer) -> bool:
    from singa_mpi.layers.base import LAYERS

    cls = LAYERS.get(layer.type) if layer.type in LAYERS else None
    return bool(cls is not None and cls.is_input)


__all__ = ["Net", "Sequential"]
