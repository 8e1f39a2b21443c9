"""The run under test and its serial oracle, built in one place for every MPI equivalence test.

``partitioned`` trains a job over the world (every rank its part of the plan);
``serial`` trains the same job alone in this process.  Tests reach the runtime
and trainer classes only through these functions, so a change of their
signatures is one edit here.

Comparisons return lists of problems (empty: agreed) for :func:`conftest.agree`.
Errors are relative to the largest magnitude of the serial value, so a float32
summation difference reads as about 1e-7 whatever the scale of the array.
"""
from __future__ import annotations

import os

import numpy as np

import nets
from singa_mpi.checkpoints.hdf5 import Checkpoint
from singa_mpi.checkpoints.snapshot import collect, restore
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.trainer import Trainer, collected_metrics, summarize


def scratch(name: str, rank: int) -> str:
    """A path under the suite's temporary folder that carries the rank (ranks never share files)."""
    return os.path.join(os.environ["SINGA_MPI_TEST_TMP"], f"{name}_r{rank}")


def partitioned(text: str, workspace: str, world) -> Trainer:
    """The job partitioned over ``world`` (collective: every rank builds its part)."""
    cfg = nets.job(text)
    return Trainer(cfg, workspace, WorkerRuntime(cfg, cfg.proto.seed, workspace, world), log=lambda line: None)


def with_servers(text: str, workspace: str, world, nservers: int) -> Trainer | None:
    """The job as SINGA's Sandblaster over ``world``: one group of ``world.size - nservers`` workers
    (ranks 0..) and ``nservers`` server ranks after them (collective).  A worker gets its trainer,
    ready to train; a server serves until every worker has closed its runtime (``finish``) and gets
    None."""
    from singa_mpi.program.job import job_programs
    from singa_mpi.runtimes.roles import place_of
    from singa_mpi.runtimes.server import ServerRuntime
    from singa_mpi.topology import SERVER, topology

    cfg = nets.job(text)
    cluster = cfg.proto.cluster
    cluster.nworker_groups, cluster.nserver_groups, cluster.server_worker_separate = 1, 1, True
    cluster.nworkers_per_group, cluster.nservers_per_group = world.size - nservers, nservers
    topo = topology(world.size, cluster)
    role = topo.role(world.rank)
    programs = job_programs(cfg, topo.workers_per_group, ["train"], servers=True)
    group = world.split(1 if role.kind == SERVER else 0, role.index)
    if role.kind == SERVER:
        ServerRuntime(cfg, cfg.proto.seed, world, topo, role, dict(programs.plans)).serve()
        group.free()
        return None
    runtime = WorkerRuntime(cfg, cfg.proto.seed, workspace, group, programs, place_of(world, topo, role, cluster))
    trainer = Trainer(cfg, workspace, runtime, log=lambda line: None)
    runtime.begin_training(None, True)
    return trainer


def finish(trainer: Trainer | None) -> None:
    """A worker of :func:`with_servers` is done: its runtime closes (the servers end after the last)."""
    if trainer is not None:
        trainer.runtime.close()


def serial(text: str, workspace: str) -> Trainer:
    """The whole job in this process: the oracle."""
    cfg = nets.job(text)
    return Trainer(cfg, workspace + "_serial", SerialRuntime(cfg, cfg.proto.seed, workspace + "_serial"),
                   log=lambda line: None)


def train(trainer: Trainer) -> list[float]:
    """Run the whole job; the training loss of every step (disp_freq 1)."""
    trainer.run()
    return [h["loss"] for h in trainer.history if h["phase"] == "train"]


def step(trainer: Trainer, index: int) -> float:
    """Train one batch as step ``index``; its loss (collective under MPI)."""
    trainer.train_one_batch(index)
    return summarize(collected_metrics(trainer.runtime, trainer.train_net))["loss"]


def snapshot(trainer: Trainer, index: int) -> Checkpoint | None:
    """Params and updater state as whole logical arrays: on every rank for the serial trainer, on rank 0
    for a partitioned one (collective)."""
    return collect(trainer, index)


def load(trainer: Trainer, ckpt: Checkpoint) -> None:
    """Put ``ckpt``'s params, updater state and data positions into ``trainer`` (every rank its shards)."""
    restore(trainer, ckpt, full=True)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over max |want| (float64 arithmetic)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-12)


def compare_losses(got: list[float], want: list[float], rtol: float, steps: int) -> list[str]:
    if len(got) != steps or len(want) != steps:
        return [f"expected {steps} losses, got {len(got)} and serial {len(want)}"]
    err = np.abs(np.array(got) - want) / np.abs(want)
    worst = int(np.argmax(err))
    return [] if err[worst] <= rtol else [f"loss at step {worst}: {got[worst]!r} vs serial {want[worst]!r}"]


def compare_arrays(kind: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float) -> list[str]:
    """Same names, same shapes, each within ``rtol`` of its serial value's largest magnitude."""
    if sorted(got) != sorted(want):
        return [f"{kind} {sorted(got)} vs serial {sorted(want)}"]
    problems = []
    for name, value in want.items():
        if got[name].shape != value.shape:
            problems.append(f"{kind} {name}: shape {got[name].shape} vs serial {value.shape}")
        elif relative_error(got[name], value) > rtol:
            problems.append(f"{kind} {name}: max error {relative_error(got[name], value):.2e} of its largest value")
    return problems


def compare_checkpoints(got: Checkpoint | None, want: Checkpoint, rtol: float, state: bool = True) -> list[str]:
    """Params, and with ``state`` the updater's arrays and counters (``got`` is None off rank 0)."""
    if got is None:
        return []
    problems = compare_arrays("param", got.params, want.params, rtol)
    if state:
        flat = {f"{name}/{slot}": value for name, slots in got.updater.items() for slot, value in slots.items()}
        oracle = {f"{name}/{slot}": value for name, slots in want.updater.items() for slot, value in slots.items()}
        problems += compare_arrays("updater state", flat, oracle, rtol)
        if got.counters != want.counters:
            problems.append(f"updater counters {got.counters} vs serial {want.counters}")
    return problems
