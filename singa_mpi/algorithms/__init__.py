"""TrainOneBatch algorithms (seed 003), in an explicit registry keyed by SINGA's AlgType names.

An algorithm drives one step over a :class:`~singa_mpi.net.Net`; it never
updates parameters itself (the trainer reduces gradients across ranks and
applies the updater), so the same algorithm runs serially and under MPI.
"""
from __future__ import annotations

from typing import Callable

from singa_mpi.errors import ConfigError
from singa_mpi.layers.base import Layer
from singa_mpi.net import Net

ALGORITHMS: dict[str, type["Algorithm"]] = {}


def register(name: str):
    def add(cls):
        ALGORITHMS[name] = cls
        return cls

    return add


def make_algorithm(name: str) -> "Algorithm":
    try:
        return ALGORITHMS[name]()
    except KeyError:
        raise ConfigError(f"train_one_batch.alg = {name}: expected one of {', '.join(sorted(ALGORITHMS))}") from None


class Algorithm:
    def train_one_batch(self, net: Net, on_layer_done: Callable[[Layer], None] | None = None) -> None:
        raise NotImplementedError

    def evaluate(self, net: Net) -> None:
        """One forward pass in test mode (test and validation phases)."""
        net.forward(train=False)


@register("kBP")
class BackPropagation(Algorithm):
    """Forward in topological order, backward in reverse; param grads start from zero."""

    def train_one_batch(self, net: Net, on_layer_done=None) -> None:
        net.zero_grads()
        net.forward(train=True)
        net.backward(on_layer_done)
        net.finish_grads()
