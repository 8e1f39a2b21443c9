"""What every TrainOneBatch algorithm provides (seed 003).

An algorithm drives the passes over a :class:`~singa_mpi.net.Net`: which layers
compute, in which order, under which pass name, and when a layer's parameter
gradients are final (``on_layer_done``, where gradient sums may start).  It
never updates parameters: the trainer hands the gradients to the sync strategy
and the updater, so the same algorithm runs serially and on every partitioning.
"""
from __future__ import annotations

from typing import Callable

from singa_mpi.layers.base import Layer
from singa_mpi.net import Net
from singa_mpi.proto import job_pb2

LayerDone = Callable[[Layer], None]


class Algorithm:
    @classmethod
    def from_conf(cls, conf: job_pb2.AlgProto) -> Algorithm:
        """An instance configured from the job's ``train_one_batch`` block."""
        return cls()

    def bind(self, job: job_pb2.JobProto) -> None:
        """Learn what the algorithm needs of the whole job (the trainer calls it once)."""

    def report(self, metrics: dict[str, float]) -> dict[str, float]:
        """The metrics a progress line and metrics.jsonl show, from the layers' means."""
        return metrics

    @staticmethod
    def trains(layer_cls: type[Layer]) -> bool:
        """Whether this algorithm trains the params of layers of ``layer_cls`` (BP: all)."""
        return True

    def train_one_batch(self, net: Net, on_layer_done: LayerDone | None = None) -> None:
        raise NotImplementedError

    def evaluate(self, net: Net) -> None:
        """One pass in test mode (test and validation phases)."""
        forward_pass(net, "forward", train=False)


def forward_pass(net: Net, phase: str, train: bool) -> None:
    """Every layer in topological order, computing ``phase``."""
    net.tracer.direction = phase
    for wire in net.wires:
        net.run_pass(wire, phase, train)


def backward_pass(net: Net, on_layer_done: LayerDone | None = None) -> None:
    """Every layer that needs a gradient, in reverse topological order; ``on_layer_done(layer)``
    once a layer with params has added its last gradient contribution."""
    net.tracer.direction = "backward"
    for wire in reversed(net.wires):
        if not wire.needs_grad:
            continue
        layer = wire.layer
        if layer.grad is None and not layer.is_loss and layer.edge() is None:
            # nothing consumed its output (SINGA's cudnn_bm.conf leaves pool2 dangling): no gradient
            # to pass on.  Connection layers still run: their collectives need every member
            continue
        net.run_backward(wire)
        if on_layer_done is not None and wire.layer.params:
            on_layer_done(wire.layer)
