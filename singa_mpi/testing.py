"""Checks for your own layers and algorithms, to call from your tests (pytest or plain asserts).

``check_layer_gradients``: a layer's backward against central differences of its forward, in float64::

    layer = build_layer('name: "s" user_type: "kSwish"', [(16,)], batch=4)   # setup + float64 params
    check_layer_gradients(layer, [np.random.default_rng(0).standard_normal((4, 16))])

``check_equivalence``: a job trained on several workers (threads in this process, with the same
communication the MPI runtime does) against the same job trained serially, step by step::

    check_equivalence("conf/digits_swish_lion.conf", workers=(2, 3), steps=3, partition_dims=(0, 1))

Both raise AssertionError saying what differs (which param or metric, at which step, by how much).
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Iterable, Sequence

import numpy as np
from google.protobuf import text_format

from singa_mpi.layers.base import Layer, LayerContext, layer_class_of
from singa_mpi.params import Param, logical_init
from singa_mpi.proto import job_pb2


def build_layer(conf: job_pb2.LayerProto | str, src_shapes, batch: int, seed: int = 7,
                ctx: LayerContext | None = None, dtype=np.float64) -> Layer:
    """Instantiate, set up and allocate params (in ``dtype``) for a stand-alone layer; ``conf`` is a
    LayerProto or the text inside a ``layer { ... }`` block; ``src_shapes`` are per-sample shapes."""
    if isinstance(conf, str):
        conf = text_format.Parse(conf, job_pb2.LayerProto())
    cls = layer_class_of(conf)
    ctx = ctx or LayerContext(global_batch=batch, seed=seed)
    layer = cls(conf, ctx)
    layer.out_shape = layer.setup([tuple(s) for s in src_shapes])
    for spec in layer.param_specs:
        param = Param(spec.conf, spec.logical_shape, spec.shard)
        value = logical_init(spec.conf, spec.logical_shape, seed)[param.shard_index()]
        param.data = value.astype(dtype)
        param.grad = np.zeros_like(param.data)
        layer.params.append(param)
    return layer


def _loss(layer: Layer, inputs, weights, train: bool) -> float:
    out = layer.forward([x.copy() for x in inputs], train)
    return float(np.sum(out * weights))


def check_layer_gradients(layer: Layer, inputs: list[np.ndarray], check_inputs=None, train: bool = True,
                          eps: float = 1e-6, rtol: float = 1e-4, atol: float = 1e-7,
                          max_entries: int = 60, seed: int = 0) -> None:
    """Compare backward() with central differences of sum(forward(x) * R).

    check_inputs: indices of inputs whose gradient is checked (default: all float inputs).
    Randomness inside forward (dropout) must be keyed by step, not by call count, so
    repeated forwards in one step see the same mask.
    """
    rng = np.random.default_rng(seed)
    if check_inputs is None:
        check_inputs = [i for i, x in enumerate(inputs) if np.issubdtype(x.dtype, np.floating)]
    out = layer.forward([x.copy() for x in inputs], train)
    weights = rng.standard_normal(out.shape)
    for p in layer.params:
        p.grad[...] = 0
    need = [i in check_inputs for i in range(len(inputs))]
    grads = layer.backward(weights.astype(out.dtype), need)

    def numeric(array: np.ndarray, index) -> float:
        old = array[index]
        array[index] = old + eps
        plus = _loss(layer, inputs, weights, train)
        array[index] = old - eps
        minus = _loss(layer, inputs, weights, train)
        array[index] = old
        return (plus - minus) / (2 * eps)

    def compare(what: str, array: np.ndarray, analytic: np.ndarray) -> None:
        assert analytic is not None, f"{what}: backward returned no gradient"
        assert analytic.shape == array.shape, f"{what}: grad shape {analytic.shape} != {array.shape}"
        flat = list(np.ndindex(array.shape))
        picks = rng.choice(len(flat), size=min(max_entries, len(flat)), replace=False)
        for k in picks:
            idx = flat[k]
            num = numeric(array, idx)
            ana = float(analytic[idx])
            assert abs(num - ana) <= atol + rtol * max(abs(num), abs(ana)), \
                f"{what}{list(idx)}: numerical {num:.8g} != analytic {ana:.8g}"

    for i in check_inputs:
        compare(f"input[{i}]", inputs[i], grads[i])
    for p in layer.params:
        compare(f"param {p.name}", p.data, p.grad.copy())


# ------------------------------------------------------------------ serial against partitioned

def check_equivalence(job: str, workers: Iterable[int] = (2,), steps: int = 3, partition_dims: Sequence[int] = (),
                      rtol: float = 1e-5, atol: float = 1e-6, timeout: float = 300.0) -> dict[str, list[float]]:
    """Train ``job`` (a file, or job text) for ``steps`` steps serially and on each count of
    ``workers``, and compare every step's metrics and the final params; returns the serial metrics.

    ``partition_dims``: run each of these schemes instead of the job as written: 0 splits the batch
    of every layer, 1 the features of every layer that can split them (the others split the batch),
    -1 splits nothing (each layer whole on its ``location``).  A job that leaves its partitioning to
    the cost model (``partition_dim: auto``) runs 0 and 1 (placements are the job's to write).  Metrics must agree to
    ``rtol`` relative to each value; params to ``rtol`` relative to the param's largest magnitude
    (plus ``atol``), as float32 sums over a different split of the rows differ in the last bits.

    The workers are threads of this process (:func:`~singa_mpi.communication.local.run_ranks`): while
    they run, numpy's BLAS has an equal share of the cores per worker (your ``OMP_NUM_THREADS`` etc. win)."""
    from singa_mpi.checkpoints.snapshot import collect
    from singa_mpi.checks.job import validate
    from singa_mpi.communication.local import run_ranks
    from singa_mpi.cost.auto import auto_layers
    from singa_mpi.launcher.checks import check_inputs
    from singa_mpi.runtimes.serial import SerialRuntime
    from singa_mpi.runtimes.worker import WorkerRuntime
    from singa_mpi.trainer import Trainer, collected_metrics, summarize

    def config(pdim: int | None):
        cfg = _read(job)
        if pdim is not None:
            _repartition(cfg.proto, pdim)
        validate(cfg)
        return cfg

    def run(trainer: Trainer) -> tuple[list[dict[str, float]], dict[str, np.ndarray] | None]:
        metrics = []
        for step in range(steps):
            trainer.train_one_batch(step)
            metrics.append(summarize(collected_metrics(trainer.runtime, trainer.train_net)))
        snapshot = collect(trainer, steps)
        trainer.runtime.close()
        return metrics, (None if snapshot is None else {name: np.array(v) for name, v in snapshot.params.items()})

    if not partition_dims and auto_layers(_read(job)):  # the schemes the cost model chooses from
        partition_dims = (0, 1)
    with tempfile.TemporaryDirectory(prefix="singa-mpi-equivalence-") as scratch:
        serial_cfg = config(None if not partition_dims else partition_dims[0])
        check_inputs(serial_cfg, serial_cfg.proto.cluster.workspace or ".", ["train"], log=None)
        serial = os.path.join(scratch, "serial")
        want, want_params = run(Trainer(serial_cfg, serial, SerialRuntime(serial_cfg, serial_cfg.proto.seed, serial),
                                        log=lambda line: None))
        _check_finite(want)
        for pdim in tuple(partition_dims) or (None,):
            for n in workers:
                cfg = config(pdim)
                label = f"{n} workers" + (f", partition_dim {pdim}" if pdim is not None else "")

                def rank(comm, cfg=cfg, n=n):
                    workspace = os.path.join(scratch, f"w{n}_{pdim}")
                    runtime = WorkerRuntime(cfg, cfg.proto.seed, workspace, comm)
                    return run(Trainer(cfg, workspace, runtime, log=lambda line: None))

                got, got_params = run_ranks(n, rank, timeout=timeout)[0]
                _compare_metrics(want, got, rtol, label)
                _compare_params(want_params, got_params, rtol, atol, label)
        return {key: [m[key] for m in want] for key in want[0]} if want else {}


def _read(job: str):
    """``job``, a file or job text, parsed."""
    from singa_mpi.config.load import load_job, parse_job

    return load_job(job) if os.path.exists(job) else parse_job(job)


def _check_finite(serial: list[dict[str, float]]) -> None:
    """The serial run's own metrics: a NaN there is the layer's bug, not the partitioning's (it used to
    be reported as a mismatch between the two)."""
    for step, metrics in enumerate(serial):
        for key, value in metrics.items():
            assert math.isfinite(value), (f"serial run: step {step}: {key} = {value!r}: the job gives non-finite "
                                          f"values before any partitioning (a layer's forward or backward)")


def _repartition(job: job_pb2.JobProto, pdim: int) -> None:
    """The scheme ``pdim`` on every layer (layers that cannot split features split the batch)."""
    job.neuralnet.partition_dim = pdim if pdim != 1 else 0
    for layer in job.neuralnet.layer:
        layer.ClearField("partition_dim")
        if pdim == 1 and layer_class_of(layer).feature_partitionable:
            layer.partition_dim = 1


def _compare_metrics(want: list[dict[str, float]], got: list[dict[str, float]], rtol: float, label: str) -> None:
    for step, (mine, theirs) in enumerate(zip(want, got, strict=True)):
        assert sorted(mine) == sorted(theirs), \
            f"{label}: step {step}: metrics {sorted(theirs)}, serially {sorted(mine)}"
        for key, value in mine.items():
            other = theirs[key]
            assert abs(other - value) <= rtol * max(abs(value), 1e-12), \
                f"{label}: step {step}: {key} = {other!r}, serially {value!r} (relative difference " \
                f"{abs(other - value) / max(abs(value), 1e-12):.2e} > {rtol:g})"


def _compare_params(want: dict[str, np.ndarray], got: dict[str, np.ndarray], rtol: float, atol: float,
                    label: str) -> None:
    assert sorted(got) == sorted(want), f"{label}: params {sorted(got)}, serially {sorted(want)}"
    for name, value in want.items():
        other = got[name]
        assert other.shape == value.shape, f"{label}: param {name}: shape {other.shape}, serially {value.shape}"
        scale = float(np.max(np.abs(value))) if value.size else 0.0
        worst = float(np.max(np.abs(other.astype(np.float64) - value))) if value.size else 0.0
        assert worst <= atol + rtol * scale, \
            f"{label}: param {name}: differs from serial by up to {worst:.3g} (largest magnitude {scale:.3g})"
