"""Compute time of each sub-layer at its own shapes, measured once per machine and cached.

A FLOP count says little about numpy layers (an im2col copy, an element-wise pass and a GEMM of the
same FLOPs differ tenfold), so the cost model times the real kernels: each distinct (layer conf, local
input shapes, output shape, param shard shapes) is built from its plan spec, fed random inputs and
timed forward and backward (the median of a few runs after a warm-up), on as many BLAS threads as the
caller runs with.  Results go to ``$XDG_CACHE_HOME/singa_mpi/kernels.json`` (``~/.cache``), keyed by
machine (host, CPU model, BLAS threads, numpy version) and by the layer code, so a second ``plan --cost``
times nothing;
``--recalibrate`` starts afresh.  Layers that read data (no sources: input layers) are not timed:
their cost is their output's bytes at the memory bandwidth (:mod:`.rates`).

A rank shares its node's memory bandwidth and last-level cache with the others: timed alone, the
convnet's layers at half the batch ran 1.3x faster than beside a second rank (their working set fits
the cache alone).  So for a plan with several ranks per node, each kernel is timed beside copies of
itself running in co-runner processes, one per other rank up to the cores there are (``corunners``,
:mod:`.corunners`), and the median is kept; timings are cached per number of co-runners.  The
co-runners are new processes, not forks, so a launched job choosing ``partition_dim: auto`` (its
ranks have initialised MPI) times its kernels the same way.

A kernel timed over and over keeps its weights and inputs in the cache; in a step, the other layers'
passes push them out when what a step touches outgrows the last-level cache
(:func:`step_outgrows_cache`: the MNIST MLP's 46 MB of weights, the convnet's activations).  The
kernels of such a plan are timed cold, the cache emptied before each run (``|cold`` in their key):
measured on this project's 2-core VM (32 MB cache), that took the model's 2-rank pipelines of both
example nets from 0.69-0.92 of the measured step to 0.96-1.14 (``docs/performance.md``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

from singa_mpi.cost.corunners import CoRunners, Kernel, KernelSpec
from singa_mpi.planner.plan import Plan, SubLayer

MIN_SECONDS = 0.03  # time each kernel at least this long (then at least MIN_RUNS runs)
MIN_RUNS = 3
COLD_RUNS = 5  # runs of a kernel timed with its caches emptied before each (each emptying costs a few ms)
DEFAULT_CACHE_BYTES = 32 * 2**20  # the last-level cache where the system does not say
TIMING_VERSION = "t5"  # bump when what a kernel timing includes changes: older cache entries are ignored


@dataclasses.dataclass(frozen=True)
class KernelTime:
    forward: float  # seconds
    backward: float  # its weight-gradient products included
    weights: float = 0.0  # of ``backward``: the weight-gradient products (what a runtime may queue)


def cache_path() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "singa_mpi" / "kernels.json"


def _blas_thread_counts() -> list[int]:
    from threadpoolctl import threadpool_info

    return sorted({info.get("num_threads", 0) for info in threadpool_info() if info.get("user_api") == "blas"})


def _blas_threads() -> int:
    return max(_blas_thread_counts(), default=1) or 1


def machine_key() -> str:
    """Host, CPU, BLAS threads and numpy: a kernel time holds for these only."""
    threads = _blas_thread_counts()
    return f"{platform.node()}|{cpu_model()}|blas{threads}|numpy{np.__version__}|{TIMING_VERSION}|{code_digest()}"


def code_digest() -> str:
    """A digest of the layer and param code: a changed kernel is timed afresh."""
    root = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha1()
    for path in sorted(root.glob("layers/*.py")) + [root / "params.py"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def is_source(sub: SubLayer) -> bool:
    """A layer that reads data rather than computing from a source (its cost is a copy)."""
    return sub.origin is not None and not sub.srcs


def signature(plan: Plan, sub: SubLayer) -> str:
    """What a sub-layer's compute time depends on: its conf, its local input and output shapes, its shards."""
    by_name = _by_name(plan)
    conf = _kernel_conf(plan, sub.origin)
    shapes = [by_name[s].out_shape for s in sub.srcs]
    text = repr((conf, shapes, sub.kinds, sub.out_shape, [p.shape for p in sub.params], plan.phase))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def _kernel_conf(plan: Plan, origin: str) -> bytes:
    """The layer's conf as its kernel sees it: without ``partition_dim`` and ``location``, which place it
    (its local shapes say what a placement changes), so that the job's layout and the same layout
    written out by ``--auto`` (every layer's partition_dim set) share their timings."""
    kept = plan.__dict__.setdefault("_kernel_confs", {})
    if origin not in kept:
        conf = type(plan.origins[origin].conf)()
        conf.CopyFrom(plan.origins[origin].conf)
        conf.ClearField("partition_dim")
        conf.ClearField("location")
        kept[origin] = conf.SerializeToString(deterministic=True)
    return kept[origin]


def _by_name(plan: Plan) -> dict[str, SubLayer]:
    cached = plan.__dict__.get("_subs_by_name")
    if cached is None:
        cached = plan.__dict__["_subs_by_name"] = {s.name: s for s in plan.sublayers}
    return cached


def corunners_for(ranks_per_node: int) -> int:
    """How many copies of a kernel to run beside it while timing it, for ``ranks_per_node`` ranks on a
    node: one per other rank, as far as this process has cores for them (its affinity: a rank bound to
    one core has no room for co-runners, and its timing alone is then the honest one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(ranks_per_node, cores) - 1)


class KernelTimes:
    """Kernel times of this machine, from the cache or measured on first use; ``corunners``: timed
    beside that many copies of themselves (:func:`corunners_for`)."""

    def __init__(self, path: pathlib.Path | None = None, recalibrate: bool = False, log=None,
                 corunners: int = 0):
        self.path = path or cache_path()
        self.machine = machine_key()
        self.log = log or (lambda line: None)
        self.corunners = corunners
        everything = {} if recalibrate else _read(self.path)
        self.everything = everything
        self.mine: dict[str, list[float]] = everything.setdefault(self.machine, {})
        self.measured = 0
        self.beside = CoRunners(corunners, blas_threads=_blas_threads()) if corunners else None

    def of(self, plan: Plan, sub: SubLayer) -> KernelTime:
        cold = step_outgrows_cache(plan)
        key = signature(plan, sub) + (f"|beside{self.corunners}" if self.corunners else "") + ("|cold" if cold else "")
        if key not in self.mine:
            self.mine[key] = list(_measure(kernel_spec(plan, sub), self.beside, cold))
            self.measured += 1
        return KernelTime(*self.mine[key])

    def save(self) -> None:
        """Write what was measured to the cache; the co-runners, if any, stop (timing more after
        this starts them again)."""
        if self.beside is not None:
            self.beside.close()
        if not self.measured:
            return
        try:  # onto what another process saved since this one read the file (its kernels stay cached)
            table = _read(self.path)
            table.setdefault(self.machine, {}).update(self.mine)
            _write(self.path, table)
        except OSError as err:  # the prediction stands: only the next one times these kernels again
            print(f"warning: kernel times not cached in {self.path} ({err.strerror or err}): the next plan "
                  f"--cost or --auto times them again (set XDG_CACHE_HOME to a writable folder)", file=sys.stderr)


def _write(path: pathlib.Path, table: dict) -> None:
    """``table`` as ``path``'s JSON, whole or not at all (another process may read it now)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".kernels")
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(table, f)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _read(path: pathlib.Path) -> dict:
    """The cache: machine key -> {kernel key: [forward, backward, weights] seconds}.  What is not of that
    shape (a damaged file, or one edited or written by something else) is left out: timed again."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {machine: {key: times for key, times in entries.items() if _is_timing(times)}
            for machine, entries in table.items() if isinstance(entries, dict)}


def _is_timing(times) -> bool:
    """Three finite seconds >= 0, the weight-gradient products' part of the backward at most the backward."""
    if not isinstance(times, list) or len(times) != 3:
        return False
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0
               for t in times):
        return False
    return times[2] <= times[1]


def kernel_spec(plan: Plan, sub: SubLayer) -> KernelSpec:
    """What it takes to build ``sub`` alone on random inputs of its local shapes."""
    by_name = _by_name(plan)
    conf = plan.origins[sub.origin].conf
    owners = {p.name: p for n in plan.origins.values() for p in n.conf.param if not p.share_from}
    train = plan.phase == "train"
    return KernelSpec(
        conf_bytes=conf.SerializeToString(),
        context=dict(global_batch=plan.batch, batch_slice=sub.batch_slice, feature_slice=sub.feature_slice,
                     seed=1, phase=plan.phase),
        src_shapes=tuple(tuple(shape) for shape in sub.src_shapes),
        owner_bytes={key: owners[key].SerializeToString() for key in (p.share_from or p.name for p in conf.param)},
        inputs=tuple((kind, tuple(by_name[s].out_shape)) for s, kind in zip(sub.srcs, sub.kinds)),
        need=tuple(kind == "data" and by_name[s].needs_grad for s, kind in zip(sub.srcs, sub.kinds)),  # as Net does
        train=train, trains=train and sub.needs_grad, name=sub.name)


def last_level_cache_bytes() -> int:
    """The largest CPU cache (the last level, shared by a node's ranks), as Linux reports it."""
    sizes = []
    for path in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]] if text[-1] in "KMG"
                         else int(text))
        except (OSError, ValueError, KeyError):
            continue
    return max(sizes, default=DEFAULT_CACHE_BYTES)


def step_outgrows_cache(plan: Plan) -> bool:
    """Whether what a step of the plan's ranks touches, their params (a replicated param once per rank:
    each has its copy) and every sub-layer's output, outgrows the last-level cache.  Then a layer's
    weights, and the activations its backward reads, come from memory, as the other layers pushed them
    out since its last pass: the MNIST MLP's 46 MB of weights on a 32 MB cache made its 16-row GEMMs run
    1.4-1.9 times their time with the weights cached.  Its kernels are then timed cold (:func:`_measure`)."""
    kept = plan.__dict__.get("_step_outgrows_cache")
    if kept is None:
        params = {(sub.rank, shard.name, shard.offsets): shard.size for sub in plan.sublayers for shard in sub.params}
        outputs = sum(math.prod(sub.out_shape) for sub in plan.sublayers)
        kept = plan.__dict__["_step_outgrows_cache"] = 4 * (sum(params.values()) + outputs) > last_level_cache_bytes()
    return kept


def _measure(spec: KernelSpec, beside: CoRunners | None = None, cold: bool = False) -> tuple[float, float, float]:
    """(forward, backward, the backward's weight-gradient products) seconds of the kernel, with
    ``beside``'s co-runners running it too; ``cold``: the caches emptied before each run."""
    with tempfile.TemporaryDirectory(prefix="singa_mpi_cost_") as workspace:
        kernel = Kernel(spec, workspace)
        corunners = beside.copies if beside is not None else 0
        evict = _evictor() if cold else None
        with beside.alongside(spec) if beside is not None else contextlib.nullcontext():
            forward = _timed([kernel.forward], corunners, evict)[0]
            if not spec.trains:
                return forward, 0.0, 0.0
            inputs, weights = _timed([kernel.input_gradients, kernel.weight_products], corunners, evict)
            return forward, inputs + weights, weights


@functools.lru_cache(maxsize=1)
def _evictor():
    """A pass over a buffer 1.5 times the last-level cache: what the cache held before is gone (one
    buffer for every kernel timed cold)."""
    buffer = np.zeros(int(1.5 * last_level_cache_bytes()) // 4, np.float32)
    return lambda: np.add(buffer, 1.0, out=buffer)


def _timed(parts: list, corunners: int = 0, evict=None) -> list[float]:
    """Seconds of each of ``parts``, run one after the other over and over (a backward's input
    gradients, then its weight-gradient products, which need what the first part left); ``evict``:
    called before the first part of each run (cold caches: the weights come from memory; what the
    first part leaves is as warm as in a step), and then ``COLD_RUNS`` runs at most."""
    times: list[list[float]] = [[] for _ in parts]
    spent = 0.0
    most = COLD_RUNS if evict is not None else 50
    while len(times[0]) < MIN_RUNS or spent < MIN_SECONDS:
        if evict is not None:
            evict()
        for part, seconds in zip(parts, times):
            start = time.perf_counter()
            part()
            seconds.append(time.perf_counter() - start)
            spent += seconds[-1]
        if len(times[0]) >= most:
            break
    if corunners:  # beside its copies the kernel's typical run, not a lucky moment they paused
        return [statistics.median(seconds) for seconds in times]
    return [min(seconds) for seconds in times]  # other processes only ever add time: the fastest is the kernel's own
