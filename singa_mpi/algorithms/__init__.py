"""TrainOneBatch algorithms (seed 003), registered by name (SINGA's AlgType names for built-ins).

An algorithm drives the passes over a :class:`~singa_mpi.net.Net` (:mod:`.base`);
it never updates parameters itself (the trainer hands gradients to the sync
strategy and the updater), so the same algorithm runs serially and under MPI.
Built-ins: back-propagation (:mod:`.bp`).
"""
from __future__ import annotations

from singa_mpi.algorithms.base import Algorithm
from singa_mpi.registry import Registry

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", "train_one_batch.alg")
ALGORITHMS.register_lazy("kBP", "singa_mpi.algorithms.bp:BackPropagation")


def make_algorithm(name: str) -> Algorithm:
    """A new instance of the algorithm registered as ``name``; ConfigError listing the valid names otherwise."""
    return ALGORITHMS.get(name)()
