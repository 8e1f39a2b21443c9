"""Automatic partitioning: each layer's partition_dim chosen by the predicted step time.

The search space is every layer's ``partition_dim`` in {0 (batch), 1 (features), -1 (whole, on
worker 0)}, each candidate partitioned by the planner (which refuses what cannot be split and proves
the schedule safe) and priced by :mod:`.model`.  A feature split pays only over a run of layers (every
boundary costs an exchange), so single-layer moves alone get stuck at pure data parallelism; the
search therefore

1. prices the pure data-parallel plan, the whole net on features where it can split, and every
   contiguous run of layers on features with the rest on the batch (the shapes hand-written hybrid
   schemes take: O(layers^2) plans);
2. from the best of those, tries every single layer at each other value and keeps any change that
   lowers the prediction, until a full sweep changes nothing;
3. keeps pure data parallelism (the plan with the fewest exchanges) unless the best is predicted at
   least MARGIN faster: the model's error is a few percent between two plans of one net, and on the
   convnet a plan predicted 4% faster ran 3-12% slower.

Plans over the memory limit per rank (params, their updater state and the activations the plan
holds, as predicted from the plan) are skipped.  The result is a choice per layer, its predicted step,
and the data-parallel prediction beside it.  Every rank of a launched job must use one choice, so the
choice is made once (``singa-mpi plan --auto -o chosen.conf``, or by the process that launches) and
written into the job.
"""
from __future__ import annotations

import dataclasses
import math

from singa_mpi.config.load import AUTO, JobConfig, effective_partition_dim
from singa_mpi.cost.model import predict
from singa_mpi.errors import ConfigError
from singa_mpi.planner import plan as make_plan

CHOICES = (0, 1, -1)
MARGIN = 0.10  # a plan other than data parallelism must be predicted this much faster to be chosen


@dataclasses.dataclass
class Choice:
    dims: dict[str, int]  # layer name -> partition_dim
    step: float  # predicted seconds
    data_parallel: float | None  # predicted seconds of every layer on the batch (None: refused)
    evaluated: int  # plans priced
    memory: int  # predicted peak bytes on the fullest rank
    rates_source: str = ""  # where the communicator's rates came from (calibrated or assumed)


def with_dims(cfg: JobConfig, dims: dict[str, int]) -> JobConfig:
    """A copy of ``cfg`` whose layers have these partition_dims (names missing keep theirs)."""
    proto = type(cfg.proto)()
    proto.CopyFrom(cfg.proto)
    for layer in proto.neuralnet.layer:
        if layer.name in dims:
            if dims[layer.name] == -1 and effective_partition_dim(proto, layer) != -1:
                layer.location = 0  # newly whole: on worker 0 (a layer already whole keeps its location)
            layer.partition_dim = dims[layer.name]
    return dataclasses.replace(cfg, proto=proto)


def plan_memory(the_plan) -> int:
    """Bytes on the fullest rank: its param shards with two more arrays each (gradient, updater
    history) and its sub-layers' outputs with their gradients."""
    per_rank = [0] * the_plan.nranks
    seen: set[tuple] = set()
    for sub in the_plan.sublayers:
        for shard in sub.params:
            if (sub.rank, shard.name, shard.offsets) not in seen:
                seen.add((sub.rank, shard.name, shard.offsets))
                per_rank[sub.rank] += 3 * 4 * shard.size
        per_rank[sub.rank] += 2 * 4 * math.prod(sub.out_shape)
    return max(per_rank)


class Search:
    """Prices candidates, each once."""

    def __init__(self, cfg: JobConfig, nranks: int, method: str, kernels, rates, memory_limit: int | None):
        self.cfg, self.nranks, self.method = cfg, nranks, method
        self.kernels, self.rates, self.memory_limit = kernels, rates, memory_limit
        self.prices: dict[tuple, tuple[float, int] | None] = {}
        self.names = [layer.name for layer in cfg.proto.neuralnet.layer]

    def price(self, dims: dict[str, int]) -> float | None:
        key = tuple(dims[name] for name in self.names)
        if key not in self.prices:
            self.prices[key] = self._price(dims)
        found = self.prices[key]
        return None if found is None else found[0]

    def _price(self, dims: dict[str, int]) -> tuple[float, int] | None:
        try:
            the_plan = make_plan(with_dims(self.cfg, dims), self.nranks, method=self.method)
        except ConfigError:
            return None  # the planner refuses it (a loss split on features, too few outputs, ...)
        memory = plan_memory(the_plan)
        if self.memory_limit is not None and memory > self.memory_limit:
            return None
        return predict(the_plan, self.method, self.kernels, self.rates).step, memory

    def memory(self, dims: dict[str, int]) -> int:
        return self.prices[tuple(dims[name] for name in self.names)][1]


def choose(cfg: JobConfig, nranks: int, method: str, kernels, rates, memory_limit: int | None = None,
           free: list[str] | None = None) -> Choice:
    """The partition_dims with the lowest predicted step (see the module docstring).  ``free``: the
    layers to choose for (default: every layer); the others keep the job's values."""
    search = Search(cfg, nranks, method, kernels, rates, memory_limit)
    names = search.names
    free = list(dict.fromkeys(names if free is None else free))
    written = original_dims(cfg)
    data = {name: (0 if name in free else written[name]) for name in names}
    candidates = [data, dict(data, **{name: 1 for name in free})]
    for lo in range(len(free)):
        for hi in range(lo + 1, len(free) + 1):
            candidates.append(dict(data, **{name: 1 for name in free[lo:hi]}))
    if nranks == 1:
        candidates = [data]
    priced = [(search.price(c), i, c) for i, c in enumerate(candidates)]
    feasible = [(p, i, c) for p, i, c in priced if p is not None]
    if not feasible:
        raise ConfigError(f"no partitioning of {cfg.path} on {nranks} worker(s) fits"
                          + (f" {memory_limit / 2**20:.0f} MiB per rank" if memory_limit else "")
                          + ": expected fewer workers or a larger memory limit")
    best_price, _, best = min(feasible, key=lambda t: (t[0], t[1]))
    improved = nranks > 1
    while improved:
        improved = False
        for name in free:
            for value in CHOICES:
                if value == best[name]:
                    continue
                trial = dict(best, **{name: value})
                price = search.price(trial)
                if price is not None and price < best_price * (1 - 1e-3):
                    best, best_price, improved = trial, price, True
    data_price = search.price(data)
    if data_price is not None and best_price > data_price * (1 - MARGIN):
        best, best_price = data, data_price  # not clearly better: the simplest plan
    return Choice(best, best_price, data_price, len(search.prices), search.memory(best), rates.source)


def original_dims(cfg: JobConfig) -> dict[str, int]:
    return {layer.name: effective_partition_dim(cfg.proto, layer) for layer in cfg.proto.neuralnet.layer}


def auto_layers(cfg: JobConfig) -> list[str]:
    """The layers whose partition_dim is `auto` (their own, or the net's)."""
    return [name for name, dim in original_dims(cfg).items() if dim == AUTO]


def choose_for_job(cfg: JobConfig, nworkers: int, method: str = "shared_memory", every_layer: bool = False,
                   memory_limit: int | None = None, recalibrate: bool = False, nodes: int = 1) -> Choice:
    """The choice on ``nworkers`` for the job's `auto` layers (``every_layer``: for all, as ``plan --auto``),
    with this machine's kernel times (timed now or read from the cache) and communicator rates."""
    from singa_mpi import threads
    from singa_mpi.cost import rates
    from singa_mpi.cost.kernels import KernelTimes, corunners_for

    if nodes > 1:
        method = "allreduce"  # node-shared memory needs one node: the runtime then takes buckets
    with threads.limit_blas(1):  # as a launched rank runs: one BLAS thread each
        kernels = KernelTimes(recalibrate=recalibrate, corunners=corunners_for(-(-nworkers // nodes)))
        choice = choose(cfg, nworkers, method, kernels, rates.network(nworkers, nodes), memory_limit,
                        free=None if every_layer else auto_layers(cfg))
    kernels.save()
    return choice


def resolved(cfg: JobConfig, dims: dict[str, int] | None) -> JobConfig:
    """``cfg`` with its `auto` layers set as ``dims`` says (one worker: all on the batch, nothing to
    choose); ConfigError when a choice is missing."""
    free = auto_layers(cfg)
    if not free:
        return cfg
    if dims is None or any(name not in dims for name in free):
        raise ConfigError(f"{cfg.path}: partition_dim: auto was not resolved for {', '.join(free)}: expected the "
                          "cost model's choice (it failed on rank 0; see its message)")
    return with_dims(cfg, {name: dims[name] for name in free})


def resolve_auto_layers(cfg, nworkers: int, method: str = "shared_memory"):
    """The job with its `partition_dim: auto` layers chosen by the cost model, and a line saying what
    was chosen (None when the job has no such layer)."""
    free = auto_layers(cfg)
    if not free:
        return cfg, None
    choice = choose_for_job(cfg, nworkers, method) if nworkers > 1 else None
    dims = choice.dims if choice is not None else {name: 0 for name in free}
    chosen = ", ".join(f"{name} {dims[name]}" for name in dict.fromkeys(free))
    predicted = f" (predicted step {1e3 * choice.step:.2f} ms)" if choice is not None else ""
    return resolved(cfg, dims), f"partition_dim: auto on {nworkers} worker(s) chose: {chosen}{predicted}"


def auto_report(cfg, nworkers: int, sync: str, memory_limit: int | None, recalibrate: bool, nodes: int
                ) -> tuple[list[str], str]:
    """``plan --auto``: every layer's partition_dim chosen by predicted step time, as lines to print,
    and the job with those choices as text (for ``-o``)."""
    from google.protobuf import text_format

    choice = choose_for_job(cfg, nworkers, sync, every_layer=True, memory_limit=memory_limit,
                            recalibrate=recalibrate, nodes=nodes)
    names = {"0": "batch", "1": "features", "-1": "whole (worker 0)"}
    before = original_dims(cfg)
    method = "allreduce" if nodes > 1 else sync  # as choose_for_job prices it
    lines = [f"automatic partitioning of {cfg.path} over {nworkers} worker(s), param sync {method}: "
             f"{choice.evaluated} plans priced (communicator rates: {choice.rates_source})"]
    for name, dim in choice.dims.items():
        mark = "" if before.get(name) == dim else f"   (the job: {before.get(name)})"
        lines.append(f"  {name:<24} partition_dim {dim:>2}  {names[str(dim)]}{mark}")
    data = f"{1e3 * choice.data_parallel:.2f} ms" if choice.data_parallel is not None else "refused by the planner"
    lines.append(f"predicted step {1e3 * choice.step:.2f} ms ("
                 f"peak {choice.memory / 2**20:.1f} MiB on the fullest rank); every layer on the batch: {data}")
    chosen = with_dims(cfg, choice.dims)
    job_text = (f"# {cfg.path} with partition_dim chosen by `singa-mpi plan --auto -n {nworkers}` "
                f"(predicted {1e3 * choice.step:.2f} ms a step)\n" + text_format.MessageToString(chosen.proto))
    return lines, job_text
