"""TrainOneBatch algorithms (seed 003), registered by name (SINGA's AlgType names for built-ins).

An algorithm drives the passes over a :class:`~singa_mpi.net.Net` (:mod:`.base`);
it never updates parameters itself (the trainer hands gradients to the sync
strategy and the updater), so the same algorithm runs serially and under MPI.
Built-ins: back-propagation (:mod:`.bp`), contrastive divergence (:mod:`.cd`), back-propagation
through time (:mod:`.bptt`).
"""
from __future__ import annotations

from singa_mpi.algorithms.base import Algorithm
from singa_mpi.layers.base import layer_class_of
from singa_mpi.proto import job_pb2
from singa_mpi.registry import Registry, selected_name

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", "train_one_batch.alg")
ALGORITHMS.register_lazy("kBP", "singa_mpi.algorithms.bp:BackPropagation")
ALGORITHMS.register_lazy("kCD", "singa_mpi.algorithms.cd:ContrastiveDivergence")
ALGORITHMS.register_lazy("kBPTT", "singa_mpi.algorithms.bptt:BackPropagationThroughTime")


def make_algorithm(conf: job_pb2.AlgProto | str) -> Algorithm:
    """The algorithm a job's ``train_one_batch`` (or a registered name) selects, configured from it;
    ConfigError listing the valid names for an unknown one."""
    if isinstance(conf, str):
        return ALGORITHMS.get(conf)()
    return algorithm_class(conf).from_conf(conf)


def algorithm_name(conf: job_pb2.AlgProto) -> str:
    """``user_alg`` when written (SINGA 0.3's worker.cc:47), else the name of ``alg``."""
    return selected_name(conf, "alg", "user_alg")


def algorithm_class(conf: job_pb2.AlgProto) -> type[Algorithm]:
    """The class ``train_one_batch`` selects; ConfigError listing the registered names otherwise."""
    return ALGORITHMS.select(conf, "alg", "user_alg", where="train_one_batch.")


def frozen_params(job: job_pb2.JobProto) -> set[str]:
    """Names of the params the job's algorithm never trains: loaded or initialised, kept in
    checkpoints, not updated and not synchronised (CD: every param outside the RBM layers).
    Call on a validated job (every layer type known)."""
    algorithm = algorithm_class(job.train_one_batch)
    trained, untouched = set(), set()
    for layer in job.neuralnet.layer:
        names = {p.share_from or p.name for p in layer.param}
        cls = layer_class_of(layer)
        (trained if algorithm.trains(cls) else untouched).update(names)
    return untouched - trained
