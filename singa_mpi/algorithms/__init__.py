"""TrainOneBatch algorithms (seed 003), in an explicit registry keyed by SINGA's AlgType names.

An algorithm drives one step over a :class:`~singa_mpi.net.Net`; it never
updates parameters itself (the trainer reduces gradients across ranks and
applies the updater), so the same algorithm runs serially and under MPI.
"""
from __future__ import annotations

from typing import Callable

from singa_mpi.layers.base import Layer
from singa_mpi.net import Net
from singa_mpi.registry import Registry

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", "train_one_batch.alg")


def make_algorithm(name: str) -> Algorithm:
    """A new instance of the algorithm registered as ``name``; ConfigError listing the valid names otherwise."""
    return ALGORITHMS.get(name)()


class Algorithm:
    def train_one_batch(self, net: Net, on_layer_done: Callable[[Layer], None] | None = None) -> None:
        raise NotImplementedError

    def evaluate(self, net: Net) -> None:
        """One forward pass in test mode (test and validation phases)."""
        net.forward(train=False)


@ALGORITHMS.register("kBP")
class BackPropagation(Algorithm):
    """Forward in topological order, backward in reverse; param grads start from zero."""

    def train_one_batch(self, net: Net, on_layer_done=None) -> None:
        net.zero_grads()
        net.forward(train=True)
        net.backward(on_layer_done)
        net.finish_grads()
