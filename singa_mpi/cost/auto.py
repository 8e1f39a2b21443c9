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
   convnet a plan predicted 4% faster ran 3-12% slower;
4. ``plan --auto`` (every layer free) also prices pipelines: every layer whole, in contiguous stages
   of about equal predicted time, one per worker, over ``PIPELINE_MICRO_BATCHES`` micro-batches in
   GPipe, 1F1B and ZB order (on two workers also with the layer on either side of the cut split over
   both, on the batch or on features: :func:`shared_cuts`), and in runs of layers dealt round robin
   (two per worker) in interleaved order; one is chosen when predicted MARGIN faster than the best of
   the above.

Plans over the memory limit per rank (:func:`memory_by_rank`, the launch's memory check's prediction:
params with their gradients and updater state, the activations and the layers' work arrays the plan
holds, the test net's outputs beside it, and the checkpoint's copies on rank 0) are skipped.  The result is a choice per layer, its predicted step,
and the data-parallel prediction beside it.  Every rank of a launched job must use one choice, so the
choice is made once (``singa-mpi plan --auto -o chosen.conf``, or by the process that launches) and
written into the job.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from singa_mpi import plugins
from singa_mpi.config.load import AUTO, JobConfig, effective_partition_dim, phases_of
from singa_mpi.cost.model import NotPriced, predict
from singa_mpi.cost.rates import Network
from singa_mpi.errors import ConfigError
from singa_mpi.planner import partition, plan as make_plan

CHOICES = (0, 1, -1)
MARGIN = 0.10  # a plan other than data parallelism must be predicted this much faster to be chosen
PIPELINE_MICRO_BATCHES = (2, 4, 8)


@dataclasses.dataclass
class Choice:
    dims: dict[str, int]  # layer name -> partition_dim
    step: float  # predicted seconds
    data_parallel: float | None  # predicted seconds of every layer on the batch (None: refused)
    evaluated: int  # plans priced
    memory: int  # predicted peak bytes on the fullest rank
    rates_source: str = ""  # where the communicator's rates came from (calibrated or assumed)
    locations: dict[str, int] = dataclasses.field(default_factory=dict)  # a pipeline's worker per layer
    pipeline: tuple[str, int] | None = None  # (schedule, micro-batches) of a chosen pipeline
    fastest_pipeline: "Choice | None" = None  # the best pipeline priced, chosen or not
    placed: bool = False  # every layer was free: the job's locations and pipeline gave way (placement_free)
    data_refusal: str = ""  # why every layer on the batch was not priced, where it was not

    def places_layers(self) -> bool:
        """Whether the choice, not the job, says where each layer runs (a pipeline's stages, or the job's
        locations and pipeline set aside: :func:`placement_free`)."""
        return self.placed or self.pipeline is not None

    def describe(self) -> str:
        """The line a launch prints about it."""
        if self.pipeline is not None:
            stages = len(set(self.locations.values()))
            return (f"partition_dim: auto chose a pipeline: every layer whole in {stages} stages{self.split_note()}, schedule "
                    f"{self.pipeline[0]} over {self.pipeline[1]} micro-batches (predicted step {1e3 * self.step:.2f} ms)")
        return "partition_dim: auto chose " + ", ".join(f"{name} {dim}" for name, dim in self.dims.items())


    def split_note(self) -> str:
        """A pipeline's layers that are not whole (split at the cut between two stages), in words."""
        split = [f"{name} split on {'the batch' if dim == 0 else 'features'} over both"
                 for name, dim in self.dims.items() if dim != -1]
        return f" but {', '.join(split)}" if split else ""


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


def placement_free(cfg: JobConfig) -> JobConfig:
    """A copy of ``cfg`` without its layers' ``location``s and its ``neuralnet.pipeline``: where the
    search places every layer, the job's placement (a hand-made pipeline's stages) is not a constraint,
    and a location of 1 is not even plannable on the one worker :func:`stage_locations` times."""
    proto = type(cfg.proto)()
    proto.CopyFrom(cfg.proto)
    for layer in proto.neuralnet.layer:
        layer.ClearField("location")
    proto.neuralnet.ClearField("pipeline")
    return dataclasses.replace(cfg, proto=proto)


def with_choice(cfg: JobConfig, choice: Choice) -> JobConfig:
    """``cfg`` as ``choice`` says: partition_dims (on :func:`placement_free` ``cfg`` where the choice
    placed every layer), and for a pipeline each layer's worker and the ``neuralnet.pipeline`` setting."""
    chosen = with_dims(placement_free(cfg) if choice.places_layers() else cfg, choice.dims)
    if choice.pipeline is None:
        return chosen
    for layer in chosen.proto.neuralnet.layer:
        layer.location = choice.locations.get(layer.name, layer.location)
    chosen.proto.neuralnet.pipeline.schedule, chosen.proto.neuralnet.pipeline.micro_batches = choice.pipeline
    return chosen


def plan_memory(the_plan, updater=None, trains: bool = True, beside: Sequence = ()) -> int:
    """Bytes on the fullest rank (:func:`memory_by_rank`)."""
    return max(sum(parts.values()) for parts in memory_by_rank(the_plan, updater, trains, beside))


WRITER = 0  # the rank that gathers and writes checkpoints
CHECKPOINT_COPIES = 3  # on the writer: its pieces' copies, the pieces gathered, the whole arrays assembled


def memory_by_rank(the_plan, updater=None, trains: bool = True, beside: Sequence = ()) -> list[dict[tuple[str, str], int]]:
    """Per rank, its predicted bytes by (layer, what) of a job that trains ``the_plan``'s net (``trains``;
    else one that only tests it: params alone, no backward, no checkpoint) with ``updater`` (its
    UpdaterProto; None: one state array per param, no scratch), and evaluates ``beside`` it the nets of
    these plans (test, validation: built and run from step 0 on, they keep their last outputs).  What:
    "params", its param shards with their gradients and the updater's state arrays
    (:meth:`~singa_mpi.updaters.Updater.kept_arrays`); "activations", its sub-layers' outputs with
    their gradients (an inserted layer under its own name; an evaluated net's outputs alone); "work
    arrays", what each layer family says it keeps besides (:meth:`~singa_mpi.layers.base.Layer.work_bytes`:
    masks, saved spectra, im2col's columns, a store decoded whole); and the largest of what comes and
    goes: "passing arrays", a forward's or backward's own (of one of its sub-layers, with the output it
    replaces, or the updater's scratch), or on the writer "checkpoint copies" of every param and its
    state.  Of a pipeline, the micro-batches a rank holds at once (GPipe: all; 1F1B: at most its
    stages to go)."""
    states, scratch = _updater_memory(updater) if trains else (0, False)
    per_rank: list[dict[tuple[str, str], int]] = [{} for _ in range(the_plan.nranks)]
    passing: list[tuple[int, str]] = [(0, "")] * the_plan.nranks  # (bytes, layer) of the largest per rank
    seen: set[tuple] = set()
    whole: dict[str, tuple[int, str]] = {}  # param -> (logical size, its layer)
    for sub in the_plan.sublayers:
        layer = sub.origin or sub.name
        for shard in sub.params:
            whole.setdefault(shard.name, (math.prod(shard.logical_shape), layer))
            if (sub.rank, shard.name, shard.offsets) not in seen:
                seen.add((sub.rank, shard.name, shard.offsets))
                _add(per_rank[sub.rank], (layer, "params"), 4 * shard.size * (2 + states if trains else 1))
                if scratch:
                    passing[sub.rank] = max(passing[sub.rank], (4 * shard.size, layer))
    for net, backward in [(the_plan, trains)] + [(other, False) for other in beside]:
        _add_outputs(net, backward, per_rank, passing)
    copies = CHECKPOINT_COPIES * 4 * (1 + states) * sum(size for size, _ in whole.values()) if trains else 0
    if copies and WRITER < the_plan.nranks:
        passing[WRITER] = max(passing[WRITER], (copies, max(whole.values())[1]))
    for rank, (parts, (most, layer)) in enumerate(zip(per_rank, passing)):
        if most:
            _add(parts, (layer, "checkpoint copies" if rank == WRITER and most == copies else "passing arrays"), most)
    return per_rank


def _add_outputs(the_plan, backward: bool, per_rank: list[dict], passing: list[tuple[int, str]]) -> None:
    """Into ``per_rank`` (and the largest ``passing``), the outputs (with their gradients where the net
    runs ``backward``) and work arrays of ``the_plan``'s sub-layers, as many micro-batches as it holds."""
    held = _micro_batches_held(the_plan)
    by_name = {(sub.rank, sub.name): sub for sub in the_plan.sublayers}
    for sub in the_plan.sublayers:
        if sub.micro >= held.get(sub.rank, sub.micro + 1):
            continue
        parts, layer, out = per_rank[sub.rank], sub.origin or sub.name, 4 * math.prod(sub.out_shape)
        _add(parts, (layer, "activations"), (2 if backward else 1) * out)
        first = by_name.get((sub.rank, sub.srcs[0])) if sub.srcs else None
        kept, passes = _work_bytes(the_plan, sub, backward, first is not None and first.needs_grad)
        if kept:
            _add(parts, (layer, "work arrays"), kept)
        passing[sub.rank] = max(passing[sub.rank], (passes + out, layer))


def evaluated_plans(cfg: JobConfig, nranks: int) -> list:
    """The plans of the nets a training run of ``cfg`` on ``nranks`` workers evaluates beside training
    (:func:`~singa_mpi.config.load.phases_of`), whose outputs :func:`memory_by_rank` counts; a phase the
    planner refuses is left out (the launch refuses the job for it)."""
    plans = []
    for phase in phases_of(cfg)[1:]:
        try:
            plans.append(partition(cfg, nranks, phase))
        except ConfigError:
            pass
    return plans


def _updater_memory(updater) -> tuple[int, bool]:
    """(state arrays per param, whether it works in a scratch array) of ``updater`` (None: 1, False)."""
    from singa_mpi.updaters import UPDATERS

    if updater is None:
        return 1, False
    kind = UPDATERS.select(updater, where="updater.")
    return kind.kept_arrays(updater), kind.uses_scratch


def _add(parts: dict[tuple[str, str], int], key: tuple[str, str], nbytes: int) -> None:
    parts[key] = parts.get(key, 0) + nbytes


def _work_bytes(the_plan, sub, backward: bool, input_grad: bool) -> tuple[int, int]:
    """(held, passing) work bytes of a sub-layer as its layer family declares them (an inserted layer:
    none); its input as the first source's whole per-sample shape, its output as this part's."""
    from singa_mpi.layers.base import layer_class_of

    node = the_plan.origins.get(sub.origin) if sub.origin else None
    if node is None or not sub.out_shape:
        return 0, 0
    in_shape = tuple(sub.src_shapes[0]) if sub.src_shapes and sub.src_shapes[0] else tuple(sub.out_shape[1:])
    return layer_class_of(node.conf).work_bytes(node.conf, sub.out_shape[0], in_shape, tuple(sub.out_shape[1:]),
                                                backward, input_grad)


def _micro_batches_held(the_plan) -> dict[int, int]:
    """Per rank of a 1F1B or ZB pipeline, how many micro-batches' activations it holds at most (counted
    as its first ones: they are the largest); empty otherwise (every sub-layer's output counts).  ZB
    holds a micro-batch until its weight gradients, at most ``S`` (1F1B's first stage's most)."""
    from singa_mpi.planner.pipeline import ONE_F_ONE_B, ZERO_BUBBLE
    from singa_mpi.program.schedules import stages_of

    pipe = the_plan.pipeline
    if pipe is None or pipe.schedule not in (ONE_F_ONE_B, ZERO_BUBBLE):
        return {}
    stage = stages_of(the_plan)
    stages = max(stage.values()) + 1
    if pipe.schedule == ZERO_BUBBLE:
        return dict.fromkeys(stage, min(pipe.micro_batches, stages))
    return {rank: min(pipe.micro_batches, stages - s) for rank, s in stage.items()}


class Search:
    """Prices candidates, each once."""

    def __init__(self, cfg: JobConfig, nranks: int, method: str, kernels, rates, memory_limit: int | None):
        self.cfg, self.nranks, self.method = cfg, nranks, method
        self.kernels, self.rates, self.memory_limit = kernels, rates, memory_limit
        self.prices: dict[tuple, tuple[float, int] | None] = {}
        self.refusals: dict[tuple, tuple[str, int]] = {}  # of the unpriced: (the planner's words, 0) or ("", bytes)
        self.names = [layer.name for layer in cfg.proto.neuralnet.layer]
        self.algorithm = job_algorithm(cfg)

    def price(self, dims: dict[str, int], pipeline: Choice | None = None) -> float | None:
        """The predicted step of ``dims`` (or of the pipeline ``pipeline`` describes), None where the
        planner refuses it or it does not fit the memory limit."""
        key = self._key(dims, pipeline)
        if key not in self.prices:
            cfg = with_dims(self.cfg, dims) if pipeline is None else with_choice(self.cfg, pipeline)
            priced = self._price(cfg)
            refused = isinstance(priced[0], str)
            self.prices[key] = None if refused else priced
            if refused:
                self.refusals[key] = priced
        found = self.prices[key]
        return None if found is None else found[0]

    def _key(self, dims: dict[str, int], pipeline: Choice | None) -> tuple:
        key = tuple(dims[name] for name in self.names)
        if pipeline is not None:
            key += (tuple(sorted(pipeline.locations.items())), pipeline.pipeline)
        return key

    def _price(self, cfg: JobConfig) -> tuple:
        """(step, peak bytes), or why not: (the planner's refusal, 0) or ("", peak bytes over the limit)."""
        try:
            the_plan = make_plan(cfg, self.nranks, method=self.method, algorithm=self.algorithm)
        except ConfigError as err:
            return str(err), 0  # the planner refuses it (a loss split on features, too few rows, ...)
        memory = plan_memory(the_plan, cfg.proto.updater, beside=evaluated_plans(cfg, self.nranks))  # as the launch checks
        if self.memory_limit is not None and memory > self.memory_limit:
            return "", memory
        # NotPriced for a CD job, as plan --cost says
        return predict(the_plan, self.method, self.kernels, self.rates, self.algorithm).step, memory

    def memory(self, dims: dict[str, int], pipeline: Choice | None = None) -> int:
        return self.prices[self._key(dims, pipeline)][1]

    def refusal(self, dims: dict[str, int]) -> str:
        """Why ``dims`` (priced before) has no price, in words ("" where it has one)."""
        planner, memory = self.refusals.get(self._key(dims, None), ("", 0))
        if not memory:
            return "refused by the planner" if planner else ""
        return f"over the memory limit ({memory / 2**20:.1f} MiB on the fullest rank)"

    def nothing_fits(self, data: dict[str, int]) -> ConfigError:
        """The error where no plan was priced: the smallest over the memory limit, else the planner's
        refusal of every layer on the batch (fewer rows than workers, ...)."""
        over = [memory for _, memory in self.refusals.values() if memory]
        where = f"no partitioning of {self.cfg.path} on {self.nranks} worker(s)"
        if over and self.memory_limit is not None:
            return ConfigError(f"{where} fits {self.memory_limit / 2**20:.0f} MiB per rank (the smallest needs "
                               f"{min(over) / 2**20:.1f} MiB on its fullest rank): expected a larger --memory-limit")
        planner, _ = self.refusals[self._key(data, None)]
        return ConfigError(f"{where} is plannable; every layer on the batch: {planner}")


def choose(cfg: JobConfig, nranks: int, method: str, kernels, rates, memory_limit: int | None = None,
           free: list[str] | None = None, pipelines: bool = False) -> Choice:
    """The partition_dims with the lowest predicted step (see the module docstring).  ``free``: the
    layers to choose for (default: every layer); the others keep the job's values.  ``pipelines``:
    also price pipelines of the whole net over the workers (step 4)."""
    names = [layer.name for layer in cfg.proto.neuralnet.layer]
    free = list(dict.fromkeys(names if free is None else free))
    placed = set(free) == set(names)
    search = Search(placement_free(cfg) if placed else cfg, nranks, method, kernels, rates, memory_limit)
    written = original_dims(cfg)
    data = {name: (0 if name in free else written[name]) for name in names}
    candidates = [data, dict(data, **{name: 1 for name in free})]
    for lo in range(len(free)):
        for hi in range(lo + 1, len(free) + 1):
            candidates.append(dict(data, **{name: 1 for name in free[lo:hi]}))
    if nranks == 1:
        candidates = [data]
    choice = _best_partitioning(search, candidates, free, data, placed)
    data_price = search.price(data)
    if pipelines and nranks > 1 and placed:  # also where no partitioning fits: a pipeline may
        piped = _best_pipeline(search, kernels, rates)
        if choice is not None:
            choice.fastest_pipeline = piped
        if piped is not None and (choice is None or piped.step < choice.step * (1 - MARGIN)):
            choice = dataclasses.replace(piped, data_parallel=data_price, evaluated=len(search.prices),
                                         fastest_pipeline=piped)
    if choice is None:
        raise search.nothing_fits(data)
    choice.data_refusal = search.refusal(data)
    return choice


def _best_partitioning(search: Search, candidates: list[dict[str, int]], free: list[str], data: dict[str, int],
                       placed: bool) -> Choice | None:
    """Steps 1-3 of the module docstring from ``candidates``; None where none is priced."""
    priced = [(search.price(c), i, c) for i, c in enumerate(candidates)]
    feasible = [(p, i, c) for p, i, c in priced if p is not None]
    if not feasible:
        return None
    best_price, _, best = min(feasible, key=lambda t: (t[0], t[1]))
    improved = search.nranks > 1
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
    return Choice(best, best_price, data_price, len(search.prices), search.memory(best), search.rates.source,
                  placed=placed)


def _best_pipeline(search: Search, kernels, rates) -> Choice | None:
    """The fastest pipeline: every layer whole, placed by :func:`stage_locations` for its schedule (one
    contiguous stage per worker; interleaved: runs dealt round robin), and on two workers also with a
    layer at the cut split over both (:func:`shared_cuts`); each schedule and micro-batch count priced."""
    from singa_mpi.planner.pipeline import SCHEDULES

    whole = {name: -1 for name in search.names}
    best = None
    for schedule in SCHEDULES:
        locations = stage_locations(search.cfg, search.nranks, search.method, kernels, rates, schedule)
        for dims in [whole] + shared_cuts(search.names, locations, search.nranks, schedule):
            for micro in PIPELINE_MICRO_BATCHES:
                candidate = Choice(dims, 0.0, None, 0, 0, rates.source, locations, (schedule, micro))
                price = search.price(dims, candidate)
                if price is not None and (best is None or price < best.step):
                    best = dataclasses.replace(candidate, step=price, memory=search.memory(dims, candidate))
    return best


def shared_cuts(names: list[str], locations: dict[str, int], nranks: int, schedule: str) -> list[dict[str, int]]:
    """Two contiguous stages on two workers, with the layer on either side of the cut split over both
    (on the batch, or on features): the split layer's share of the work moves to the lighter stage
    (the CIFAR-10 convnet's conv2 halves on the batch), and its exchanges, sent as messages, keep the
    stages apart.  Layer granularity alone cannot balance a net whose heaviest layer sits at the cut."""
    from singa_mpi.planner.pipeline import INTERLEAVED

    if nranks != 2 or schedule == INTERLEAVED:
        return []
    order = list(dict.fromkeys(names))
    first_of_second = next((i for i, name in enumerate(order) if locations.get(name) == 1), None)
    if not first_of_second:
        return []
    whole = {name: -1 for name in names}
    return [dict(whole, **{order[at]: dim}) for at in (first_of_second, first_of_second - 1) for dim in (0, 1)]


def stage_locations(cfg: JobConfig, nranks: int, method: str, kernels, rates, schedule: str = "") -> dict[str, int]:
    """Each layer's stage (its ``location``) when every layer is whole on one of ``nranks`` workers:
    contiguous stages of about equal predicted time (the 1-worker plan's forward and backward per
    layer, so that pooling, normalisation and a convolution's large maps count as they run); for the
    interleaved schedule, runs of layers dealt round robin (:func:`interleaved_stages`)."""
    from singa_mpi.planner import partition
    from singa_mpi.planner.pipeline import INTERLEAVED, balanced_stages, interleaved_stages

    # once per name: a layer of each phase may share one (the train and test data layers)
    names = list(dict.fromkeys(layer.name for layer in cfg.proto.neuralnet.layer))
    serial_plan = partition(placement_free(cfg), 1, "train")
    serial = predict(serial_plan, method, kernels, rates, job_algorithm(cfg))
    per_layer = {cost.name: cost.forward + cost.backward for cost in serial.layers}
    work = [per_layer.get(name, 0.0) for name in names]
    if schedule != INTERLEAVED:
        return dict(zip(names, balanced_stages(work, nranks)))
    return dict(zip(names, interleaved_stages(work, nranks, cuts=_cut_costs(serial_plan, names, rates))))


def _cut_costs(serial_plan, names: list[str], rates) -> list[float]:
    """Per layer, what cutting the net before it costs each side: its sources' outputs sent forward,
    and their gradients back, at the point-to-point rate."""
    out_bytes = {sub.origin: 4 * math.prod(sub.out_shape) for sub in serial_plan.sublayers if sub.origin}
    link = (rates.local if isinstance(rates, Network) else rates).p2p
    return [sum(2 * link.time(out_bytes.get(src, 0)) for src in serial_plan.origins[name].conf.srclayers)
            if name in serial_plan.origins else 0.0 for name in names]


def timed_stage_locations(cfg: JobConfig, nworkers: int, method: str = "shared_memory",
                          schedule: str = "") -> dict[str, int]:
    """:func:`stage_locations` with this machine's kernel times (timed now or read from the cache)."""
    from singa_mpi import threads
    from singa_mpi.cost import rates
    from singa_mpi.cost.kernels import KernelTimes, corunners_for

    with threads.limit_blas(1):  # as a launched rank runs: one BLAS thread each
        kernels = KernelTimes(corunners=corunners_for(nworkers))
        locations = stage_locations(cfg, nworkers, method, kernels, rates.network(nworkers, 1), schedule)
    kernels.save()
    return locations


def job_algorithm(cfg: JobConfig):
    """The job's training algorithm: the model prices its programs, and refuses CD's (NotPriced)."""
    from singa_mpi.algorithms import make_algorithm

    return make_algorithm(cfg.proto.train_one_batch)


def original_dims(cfg: JobConfig) -> dict[str, int]:
    return {layer.name: effective_partition_dim(cfg.proto, layer) for layer in cfg.proto.neuralnet.layer}


def auto_layers(cfg: JobConfig) -> list[str]:
    """The layers whose partition_dim is `auto` (their own, or the net's)."""
    return [name for name, dim in original_dims(cfg).items() if dim == AUTO]


def choose_for_job(cfg: JobConfig, nworkers: int, method: str = "shared_memory", every_layer: bool = False,
                   memory_limit: int | None = None, recalibrate: bool = False, nodes: int = 1,
                   pipelines: bool = False) -> Choice:
    """The choice on ``nworkers`` for the job's `auto` layers (``every_layer``: for all, as ``plan --auto``;
    ``pipelines``: pipelines priced too), with this machine's kernel times (timed now or read from the
    cache) and communicator rates."""
    from singa_mpi import threads
    from singa_mpi.cost import rates
    from singa_mpi.cost.kernels import KernelTimes, corunners_for

    if nodes > 1:
        method = "allreduce"  # node-shared memory needs one node: the runtime then takes buckets
    with threads.limit_blas(1):  # as a launched rank runs: one BLAS thread each
        kernels = KernelTimes(recalibrate=recalibrate, corunners=corunners_for(-(-nworkers // nodes)))
        try:
            choice = choose(cfg, nworkers, method, kernels, rates.network(nworkers, nodes), memory_limit,
                            free=None if every_layer else auto_layers(cfg), pipelines=pipelines)
        except NotPriced as err:
            if every_layer:
                raise
            raise ConfigError(f"{auto_where(cfg)}: partition_dim = auto: {err.reason()}: expected partition_dim "
                              f"0, 1 or -1 (auto chooses for BP and BPTT jobs)") from None
        finally:
            kernels.save()
    return choice


def auto_where(cfg: JobConfig) -> str:
    """``FILE:LINE:COL`` of the job's first `partition_dim: auto` (the net's, else a layer's)."""
    if cfg.proto.neuralnet.partition_dim == AUTO:
        return cfg.where("neuralnet", "partition_dim")
    first = next(index for index, layer in enumerate(cfg.proto.neuralnet.layer) if layer.partition_dim == AUTO)
    return cfg.layer_where(first, "partition_dim")


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
    choice = choose_for_job(cfg, nworkers, method, pipelines=True) if nworkers > 1 else None
    if choice is None:
        dims = {name: 0 for name in free}
        return resolved(cfg, dims), f"partition_dim: auto on {nworkers} worker(s) chose: " + \
            ", ".join(f"{name} 0" for name in dict.fromkeys(free))
    chosen_cfg = resolved(cfg, choice.dims)
    if choice.places_layers():
        chosen_cfg = with_choice(chosen_cfg, choice)
    if choice.pipeline is not None:
        return chosen_cfg, f"{choice.describe()} on {nworkers} worker(s)"
    chosen = ", ".join(f"{name} {choice.dims[name]}" for name in dict.fromkeys(free))
    return chosen_cfg, (f"partition_dim: auto on {nworkers} worker(s) chose: {chosen} "
                        f"(predicted step {1e3 * choice.step:.2f} ms)")


def auto_report(cfg, nworkers: int, sync: str, memory_limit: int | None, recalibrate: bool, nodes: int
                ) -> tuple[list[str], str]:
    """``plan --auto``: every layer's partition_dim chosen by predicted step time, as lines to print,
    and the job with those choices as text (for ``-o``)."""
    from google.protobuf import text_format

    choice = choose_for_job(cfg, nworkers, sync, every_layer=True, memory_limit=memory_limit,
                            recalibrate=recalibrate, nodes=nodes, pipelines=True)
    names = {"0": "batch", "1": "features", "-1": "whole (worker 0)"}
    before = original_dims(cfg)
    method = "allreduce" if nodes > 1 else sync  # as choose_for_job prices it
    lines = [f"automatic partitioning of {cfg.path} over {nworkers} worker(s), param sync {method}: "
             f"{choice.evaluated} plans priced (communicator rates: {choice.rates_source})"]
    for name, dim in choice.dims.items():
        written = before.get(name)
        mark = "" if written == dim else f"   (the job: {'auto' if written == AUTO else written})"
        where = f"whole on worker {choice.locations[name]}" if choice.pipeline and dim == -1 else names[str(dim)]
        lines.append(f"  {name:<24} partition_dim {dim:>2}  {where}{mark}")
    if choice.pipeline:
        lines.append(f"  a pipeline: schedule {choice.pipeline[0]}, {choice.pipeline[1]} micro-batches "
                     f"(neuralnet.pipeline)")
    data = f"{1e3 * choice.data_parallel:.2f} ms" if choice.data_parallel is not None else choice.data_refusal
    lines.append(f"predicted step {1e3 * choice.step:.2f} ms ("
                 f"peak {choice.memory / 2**20:.1f} MiB on the fullest rank); every layer on the batch: {data}")
    piped = choice.fastest_pipeline
    if piped is not None and choice.pipeline is None:
        from singa_mpi.planner.pipeline import INTERLEAVED

        placed = ("runs of layers dealt round robin" if piped.pipeline[0] == INTERLEAVED
                  else f"stages of about equal time{piped.split_note()}")
        lines.append(f"the fastest pipeline ({piped.pipeline[0]}, {piped.pipeline[1]} micro-batches, {placed}): "
                     f"{1e3 * piped.step:.2f} ms")
    chosen = with_choice(cfg, choice)
    if chosen.proto.neuralnet.partition_dim == AUTO:  # every layer says its own: no `auto` (read as 1000) left
        chosen.proto.neuralnet.ClearField("partition_dim")
    plugins.made_portable(chosen.proto, cfg.path)  # -o writes it elsewhere: its plugin files by absolute path
    job_text = (f"# {cfg.path} with partition_dim chosen by `singa-mpi plan --auto -n {nworkers}` "
                f"(predicted {1e3 * choice.step:.2f} ms a step)\n" + text_format.MessageToString(chosen.proto))
    return lines, job_text
