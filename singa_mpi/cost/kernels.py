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
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import platform
import tempfile
import time

import numpy as np

from singa_mpi.layers.base import LayerContext, layer_class_of
from singa_mpi.params import make_param
from singa_mpi.planner.plan import Plan, SubLayer

MIN_SECONDS = 0.03  # time each kernel at least this long (then at least MIN_RUNS runs)
MIN_RUNS = 3
TIMING_VERSION = "t3"  # bump when what a kernel timing includes changes: older cache entries are ignored


@dataclasses.dataclass(frozen=True)
class KernelTime:
    forward: float  # seconds
    backward: float


def cache_path() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "singa_mpi" / "kernels.json"


def machine_key() -> str:
    """Host, CPU, BLAS threads and numpy: a kernel time holds for these only."""
    from threadpoolctl import threadpool_info

    threads = sorted({info.get("num_threads", 0) for info in threadpool_info() if info.get("user_api") == "blas"})
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
    node = plan.origins[sub.origin]
    conf = node.conf.SerializeToString(deterministic=True)
    shapes = [by_name[s].out_shape for s in sub.srcs]
    text = repr((conf, shapes, sub.kinds, sub.out_shape, [p.shape for p in sub.params], plan.phase))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def _by_name(plan: Plan) -> dict[str, SubLayer]:
    cached = plan.__dict__.get("_subs_by_name")
    if cached is None:
        cached = plan.__dict__["_subs_by_name"] = {s.name: s for s in plan.sublayers}
    return cached


class KernelTimes:
    """Kernel times of this machine, from the cache or measured on first use."""

    def __init__(self, path: pathlib.Path | None = None, recalibrate: bool = False, log=None):
        self.path = path or cache_path()
        self.machine = machine_key()
        self.log = log or (lambda line: None)
        everything = {} if recalibrate else _read(self.path)
        self.everything = everything
        self.mine: dict[str, list[float]] = everything.setdefault(self.machine, {})
        self.measured = 0

    def of(self, plan: Plan, sub: SubLayer) -> KernelTime:
        key = signature(plan, sub)
        if key not in self.mine:
            self.mine[key] = list(_measure(plan, sub))
            self.measured += 1
        forward, backward = self.mine[key]
        return KernelTime(forward, backward)

    def save(self) -> None:
        if not self.measured:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".kernels")
        with os.fdopen(handle, "w") as f:
            json.dump(self.everything, f)
        os.replace(temporary, self.path)  # whole or not at all: another process may read it now


def _read(path: pathlib.Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _measure(plan: Plan, sub: SubLayer) -> tuple[float, float]:
    """(forward, backward) seconds of ``sub`` on random inputs of its local shapes."""
    by_name = _by_name(plan)
    node = plan.origins[sub.origin]
    with tempfile.TemporaryDirectory(prefix="singa_mpi_cost_") as workspace:
        ctx = LayerContext(global_batch=plan.batch, batch_slice=sub.batch_slice, feature_slice=sub.feature_slice,
                           seed=1, workspace=workspace, phase=plan.phase)
        layer = layer_class_of(node.conf)(node.conf, ctx)
        layer.out_shape = tuple(layer.setup(sub.src_shapes))
        owners = {p.name: p for n in plan.origins.values() for p in n.conf.param if not p.share_from}
        layer.params = [make_param(owners[spec.conf.share_from or spec.conf.name], spec.logical_shape, spec.shard, 1)
                        for spec in layer.param_specs]
        rng = np.random.default_rng(0)
        inputs = [np.zeros(by_name[s].out_shape[:1], np.int32) if kind == "aux"  # labels: one per row
                  else rng.standard_normal(by_name[s].out_shape).astype(np.float32)
                  for s, kind in zip(sub.srcs, sub.kinds)]
        need = [kind == "data" and by_name[s].needs_grad for s, kind in zip(sub.srcs, sub.kinds)]  # as Net does
        train = plan.phase == "train"

        def forward() -> np.ndarray:
            return layer.compute("forward", inputs, train)

        out = forward()
        grad = None if out is None or out.dtype.kind != "f" else np.ones_like(out)

        def backward() -> None:  # with the weight-gradient products a runtime may defer (Param.pending)
            for param in layer.params:
                param.zero_grad()
            layer.backward(grad, need)
            for param in layer.params:
                param.finish_grad()
        if not (train and sub.needs_grad):
            return _timed(forward), 0.0
        backward()
        return _timed(forward), _timed(backward)


def _timed(run) -> float:
    times, spent = [], 0.0
    while len(times) < MIN_RUNS or spent < MIN_SECONDS:
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        spent += times[-1]
        if len(times) >= 50:
            break
    return min(times)  # other processes only ever add time: the fastest run is the kernel's own
