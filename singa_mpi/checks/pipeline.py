"""What a pipelined step (``neuralnet.pipeline``) needs of the job: a schedule it knows, a micro-batch
count the batch can hold, an algorithm whose step is a forward and a backward pass, and layers that
compute each row on its own.  What depends on the rank count (a stage split over more workers than a
micro-batch has rows, a schedule whose calls would cross) is the planner's and the proof's to refuse.
"""
from __future__ import annotations

from singa_mpi.algorithms import algorithm_name
from singa_mpi.config.load import JobConfig
from singa_mpi.errors import ConfigError
from singa_mpi.layers.base import layer_class_of
from singa_mpi.net import global_batch_size, layer_error, phase_nodes
from singa_mpi.planner.pipeline import SCHEDULES

# why each algorithm's step cannot be cut into micro-batches
_ALGORITHM_REFUSALS = {
    "kCD": "contrastive divergence runs Gibbs rounds over the whole batch between its passes, no forward "
           "and backward per block of rows",
    "kBPTT": "BPTT carries each sequence's hidden state from one batch to the next in its recurrent layers, "
             "which a pipeline's blocks of rows would each have to carry apart",
}


def check_pipeline(cfg: JobConfig) -> None:
    """ConfigError (file:line, the field, what was expected) for the first thing a pipelined training
    step cannot run; nothing without ``neuralnet.pipeline``."""
    net = cfg.proto.neuralnet
    if not net.HasField("pipeline"):
        return
    conf = net.pipeline
    if conf.schedule not in SCHEDULES:
        raise _fail(cfg, "schedule", f"neuralnet.pipeline.schedule = {conf.schedule!r}: expected one of "
                                     f"{', '.join(repr(s) for s in SCHEDULES)}")
    micro = conf.micro_batches
    if micro < 1:
        raise _fail(cfg, "micro_batches", f"neuralnet.pipeline.micro_batches = {micro}: expected a positive count")
    if micro == 1:
        return  # one block: the unpipelined step
    nodes = phase_nodes(cfg, "train")
    batch = global_batch_size(cfg, nodes)
    if micro > batch:
        raise _fail(cfg, "micro_batches", f"neuralnet.pipeline.micro_batches = {micro}: expected at most the "
                                          f"training batch's {batch} rows (each micro-batch holds at least one)")
    alg = algorithm_name(cfg.proto.train_one_batch)
    if alg in _ALGORITHM_REFUSALS:
        raise _fail(cfg, "micro_batches", f"neuralnet.pipeline.micro_batches = {micro}: a pipeline cannot run "
                                          f"{alg}: {_ALGORITHM_REFUSALS[alg]}; expected micro_batches: 1 "
                                          f"(or no pipeline) for this job")
    for node in nodes:
        cls = layer_class_of(node.conf)
        reason = cls.micro_batch_refusal or cls.batch_split_refusal
        if reason:
            raise layer_error(cfg, node, "type", node.type_name,
                              f"a layer that can run on micro-batches of rows: {reason}; remove "
                              f"neuralnet.pipeline (or set micro_batches: 1) to train this net")


def _fail(cfg: JobConfig, field: str, message: str) -> ConfigError:
    return ConfigError(f"{cfg.where('neuralnet', 'pipeline', field)}: {message}")


__all__ = ["check_pipeline"]
