"""Micro-batched pipelines in the plan: the job's setting and a plan cut into micro-batches (pure).

A pipelined training step cuts the batch into ``M`` contiguous row blocks (``chunk(B, M, m)``).  The
plan of block ``m`` is the unpipelined plan of those rows over the same ranks (the same placement and
partitioning, each data-split stage splitting the block's rows), so the pipelined plan is the ``M``
block plans side by side: every sub-layer and connection layer once per block, named with the block
(``fc1@0/mb1``, ``bridge_src(fc1->fc2)/mb1``), every exchange its own (its own tags), and the params
as before (a rank's blocks of one layer share its params; their gradients add up to the whole batch's
before the one sync and update of the step).  In which order a rank runs its blocks' passes is the
schedule's (:mod:`singa_mpi.program.schedules`).

:func:`check_pipeline` refuses what a pipelined step cannot run (``check`` calls it, and so does the
planner for any job it pipelines, however the job was made: by hand, by ``plan --auto``).
"""
from __future__ import annotations

import dataclasses
import math

from singa_mpi.algorithms import algorithm_name
from singa_mpi.errors import ConfigError
from singa_mpi.layers.base import layer_class_of
from singa_mpi.net import global_batch_size, layer_error, phase_nodes
from singa_mpi.planner.chunk import chunk

GPIPE, ONE_F_ONE_B, ZERO_BUBBLE, INTERLEAVED = "gpipe", "1f1b", "zb", "interleaved"
SCHEDULES = (GPIPE, ONE_F_ONE_B, ZERO_BUBBLE, INTERLEAVED)
INTERLEAVED_CHUNKS = 2  # the runs of layers each worker holds when a pipeline is placed for ``interleaved``
_MOST_CUTS_TRIED = 200_000  # cut sets the interleaved placement tries one by one; more: round robin of runs


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """``micro_batches`` row blocks per step, run in the order of ``schedule``."""

    micro_batches: int
    schedule: str

    def blocks(self, batch: int) -> list[tuple[int, int]]:
        """Rows ``[lo, hi)`` of each micro-batch of a batch of ``batch`` rows."""
        return [chunk(batch, self.micro_batches, m) for m in range(self.micro_batches)]


def pipeline_of(proto, phase: str, nranks: int) -> Pipeline | None:
    """The job's pipeline for ``phase`` on ``nranks`` workers, or None: only a training step on
    several workers is pipelined (one worker has no stages to overlap; evaluation runs whole batches),
    and one micro-batch is the unpipelined step."""
    net = proto.neuralnet
    if phase != "train" or nranks < 2 or not net.HasField("pipeline") or net.pipeline.micro_batches < 2:
        return None
    return Pipeline(net.pipeline.micro_batches, net.pipeline.schedule)


def balanced_stages(work: list[float], stages: int) -> list[int]:
    """The stage of each layer (``work``: per layer, in the net's order) in ``stages`` contiguous runs,
    the largest run as small as it can be: binary search on that largest run, each candidate checked
    greedily (linear), then the runs it allows."""
    stages = max(1, min(stages, len(work)))

    def runs_within(limit: float) -> list[int] | None:
        cuts, total = [], 0.0
        for index, w in enumerate(work):
            if w > limit:
                return None
            if total + w > limit:
                cuts.append(index)
                total = 0.0
            total += w
        return cuts if len(cuts) < stages else None

    lo, hi = max(work, default=0.0), float(sum(work))
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if runs_within(mid) is not None else (mid, hi)
    cuts = runs_within(hi) or []
    # every stage holds a layer: split the longest runs until there are ``stages`` of them
    bounds = [0] + cuts + [len(work)]
    while len(bounds) - 1 < stages:
        longest = max(range(len(bounds) - 1), key=lambda i: bounds[i + 1] - bounds[i])
        bounds.insert(longest + 1, (bounds[longest] + bounds[longest + 1]) // 2)
    return [sum(1 for cut in bounds[1:-1] if index >= cut) for index in range(len(work))]


def interleaved_stages(work: list[float], workers: int, chunks: int = INTERLEAVED_CHUNKS,
                       cuts: list[float] | None = None) -> list[int]:
    """The worker of each layer (``work``: per layer, in the net's order) when the net is cut into
    ``workers * chunks`` contiguous runs (virtual stages) dealt round robin: run ``v`` on worker
    ``v % workers``.  Where a run of one worker is heavy, a light run of the same worker can make up
    for it, so the busiest worker's total can be smaller than any contiguous cut's (the MNIST MLP's fc2
    holds 42% of its work: fc1 with fc3-fc4 on one worker, fc2 with fc5-fc6 on the other).  ``cuts[i]``:
    what cutting before layer ``i`` costs each of the two workers (its output's messages forward and
    its gradient back), counted in their totals, so that a cut through a convolution's large maps loses
    to one after pooling.  The cuts minimise the busiest worker's total, then the longest run (the
    pipeline's fill); every cut set is tried where there are few, else the runs are
    :func:`balanced_stages`'s."""
    import itertools

    runs = workers * chunks
    if workers < 2 or chunks < 2 or len(work) < runs:
        return balanced_stages(work, workers)
    if math.comb(len(work) - 1, runs - 1) > _MOST_CUTS_TRIED:
        return [stage % workers for stage in balanced_stages(work, runs)]
    cost = cuts or [0.0] * len(work)
    prefix = [0.0]
    for w in work:
        prefix.append(prefix[-1] + w)
    best, best_bounds = None, None
    for inner in itertools.combinations(range(1, len(work)), runs - 1):
        bounds = (0,) + inner + (len(work),)
        lengths = [prefix[bounds[v + 1]] - prefix[bounds[v]] for v in range(runs)]
        totals = [0.0] * workers
        for v in range(runs):
            totals[v % workers] += lengths[v]
        for v, at in enumerate(inner):  # between run v (worker v % n) and run v + 1
            totals[v % workers] += cost[at]
            totals[(v + 1) % workers] += cost[at]
        key = (max(totals), max(lengths))
        if best is None or key < best:
            best, best_bounds = key, bounds
    assert best_bounds is not None
    return [next(v for v in range(runs) if index < best_bounds[v + 1]) % workers for index in range(len(work))]


# why each algorithm's step cannot be cut into micro-batches
_ALGORITHM_REFUSALS = {
    "kCD": "contrastive divergence runs Gibbs rounds over the whole batch between its passes, no forward "
           "and backward per block of rows",
    "kBPTT": "BPTT carries each sequence's hidden state from one batch to the next in its recurrent layers, "
             "which a pipeline's blocks of rows would each have to carry apart",
}


def check_pipeline(cfg) -> None:
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


def _fail(cfg, field: str, message: str) -> ConfigError:
    return ConfigError(f"{cfg.where('neuralnet', 'pipeline', field)}: {message}")


def micro_name(name: str, micro: int) -> str:
    """A sub-layer's name in micro-batch ``micro`` (``fc1@0/mb1``)."""
    return f"{name}/mb{micro}"


def join_blocks(blocks: list) -> tuple[list, list]:
    """The sub-layers and exchanges of the block plans as one plan's: names and sources marked with
    the block, exchange ids renumbered (a bridge's tags follow its id: every block its own).
    ``blocks``: per micro-batch, (sub-layers, exchanges) of its plan."""
    sublayers, exchanges = [], []
    for micro, (subs, exs) in enumerate(blocks):
        for ex in exs:
            ex.id = len(exchanges)
            exchanges.append(ex)
        for sub in subs:
            sublayers.append(dataclasses.replace(sub, name=micro_name(sub.name, micro),
                                                 srcs=[micro_name(s, micro) for s in sub.srcs], micro=micro))
    return sublayers, exchanges


def refused_schedule(cfg, plan, err: ConfigError) -> ConfigError:
    """The proof's refusal; of a pipelined step's programs, as the pipeline's: its schedule is what
    made the calls cross (the unpipelined step of the same plan never does)."""
    if plan.pipeline is None:
        return err
    pipe = plan.pipeline
    other = INTERLEAVED if pipe.schedule != INTERLEAVED else GPIPE
    advice = f", or schedule: \"{other}\""
    return ConfigError(f"{cfg.where('neuralnet', 'pipeline', 'schedule')}: neuralnet.pipeline.schedule = "
                       f"{pipe.schedule!r} with {pipe.micro_batches} micro-batches on {plan.nranks} workers: {err}: "
                       f"expected a placement where each worker holds one contiguous run of layers{advice}")


__all__ = ["Pipeline", "pipeline_of", "check_pipeline", "micro_name", "join_blocks", "refused_schedule", "balanced_stages", "SCHEDULES",
           "GPIPE", "ONE_F_ONE_B", "ZERO_BUBBLE", "INTERLEAVED", "INTERLEAVED_CHUNKS", "interleaved_stages"]
