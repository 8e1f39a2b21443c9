"""Contrastive divergence (``alg: kCD``, ``cd_conf { cd_k }``): SINGA 0.3's CDWorker, on any partitioning.

One step (seed 003; SINGA's worker.cc:507-533):

1. the positive pass over every layer in topological order: layers below an
   RBM compute as in BP (their params stay frozen), an RBM's hidden layer
   computes h⁺ from its input v⁺;
2. ``cd_k`` Gibbs rounds for each RBM pair: the top-down half (the hidden layer
   samples ĥ and sends ĥ·W down the pair's edge, backwards through any
   connection layers, which sum the partial products of split hidden units),
   then the negative pass up the edge (v⁻, then h⁻);
3. each RBM layer adds its CD-k gradient; ``on_layer_done`` lets the sync
   strategy start the sums; the trainer then updates as for any param.

Test and validation batches run the positive pass and one reconstruction, whose
error the visible layer reports.  The passes are the program of
:func:`singa_mpi.program.passes.cd_train` (and ``cd_evaluate``).  Which params train: those of the RBM layers;
every other param is loaded or initialised and left alone (:func:`trained_layer`).
"""
from __future__ import annotations

from singa_mpi.algorithms.base import Algorithm
from singa_mpi.layers.base import Layer
from singa_mpi.program import passes
from singa_mpi.proto import job_pb2


class ContrastiveDivergence(Algorithm):
    def __init__(self, cd_k: int = 1):
        if cd_k < 1:
            raise ValueError(f"cd_k = {cd_k}: expected at least 1 Gibbs round")
        self.cd_k = int(cd_k)

    @classmethod
    def from_conf(cls, conf: job_pb2.AlgProto) -> ContrastiveDivergence:
        return cls(conf.cd_conf.cd_k)

    @staticmethod
    def trains(layer_cls: type[Layer]) -> bool:
        return bool(layer_cls.energy_role)

    def train_actions(self, units: list) -> list:
        return passes.cd_train(units, self.cd_k)

    def evaluate_actions(self, units: list) -> list:
        return passes.cd_evaluate(units)
