"""TrainOneBatch algorithms (seed 003), registered by name (SINGA's AlgType names for built-ins).

An algorithm drives the passes over a :class:`~singa_mpi.net.Net` (:mod:`.base`);
it never updates parameters itself (the trainer hands gradients to the sync
strategy and the updater), so the same algorithm runs serially and under MPI.
Built-ins: back-propagation (:mod:`.bp`), contrastive divergence (:mod:`.cd`), back-propagation
through time (:mod:`.bptt`).
"""
from __future__ import annotations

from singa_mpi.algorithms.base import Algorithm
from singa_mpi.layers.base import layer_class
from singa_mpi.proto import job_pb2
from singa_mpi.registry import Registry

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", "train_one_batch.alg")
ALGORITHMS.register_lazy("kBP", "singa_mpi.algorithms.bp:BackPropagation")
ALGORITHMS.register_lazy("kCD", "singa_mpi.algorithms.cd:ContrastiveDivergence")
ALGORITHMS.register_lazy("kBPTT", "singa_mpi.algorithms.bptt:BackPropagationThroughTime")


def make_algorithm(conf: job_pb2.AlgProto | str) -> Algorithm:
    """The algorithm a job's ``train_one_batch`` (or a registered name) selects, configured from it;
    ConfigError listing the valid names for an unknown one."""
    if isinstance(conf, str):
        return ALGORITHMS.get(conf)()
    return ALGORITHMS.get(job_pb2.AlgType.Name(conf.alg)).from_conf(conf)


def frozen_params(job: job_pb2.JobProto) -> set[str]:
    """Names of the params the job's algorithm never trains: loaded or initialised, kept in
    checkpoints, not updated and not synchronised (CD: every param outside the RBM layers).
    Call on a validated job (every layer type known)."""
    algorithm = ALGORITHMS.get(job_pb2.AlgType.Name(job.train_one_batch.alg))
    trained, untouched = set(), set()
    for layer in job.neuralnet.layer:
        names = {p.share_from or p.name for p in layer.param}
        cls = layer_class(job_pb2.LayerType.Name(layer.type))
        (trained if algorithm.trains(cls) else untouched).update(names)
    return untouched - trained
