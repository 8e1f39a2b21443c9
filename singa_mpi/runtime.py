"""Entry points that run a job: in one process, or one worker per MPI rank.

``run_training`` runs the serial runtime in a single process (or an MPI world
of size 1) and the partitioned runtime of :mod:`singa_mpi.parallel` when
launched on several ranks.  Under MPI a job fails in one of two ways, and
neither hangs:

* before any communication (reading, validating and planning the job, which
  every rank does by itself): the ranks exchange their verdicts once, rank 0
  prints the first error, and every rank exits with its code;
* after that (a data file missing on one rank, a bug, a signal): the failing
  rank prints what failed where (rank, layer, step) and calls MPI_Abort, which
  ends every rank promptly.  A rank that stops responding is caught by the
  ``--stall-timeout`` watchdog.
"""
from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

from singa_mpi import checkpoint
from singa_mpi.config.load import JobConfig, load_job
from singa_mpi.config.validate import validate
from singa_mpi.errors import ConfigError, DataError, SingaError
from singa_mpi.train import SerialRuntime, Trainer

EXIT_ABORT = 1


def mpi_world():
    """The MPI world communicator if this process was launched on several ranks, else None."""
    try:
        from singa_mpi import comm
    except ImportError:
        return None
    if comm.world_size() <= 1:
        return None
    return comm.world()


def _prepare(job: str | JobConfig, seed: int | None) -> JobConfig:
    cfg = job if isinstance(job, JobConfig) else load_job(job)
    if seed is not None:
        cfg.proto.seed = seed
    validate(cfg)
    return cfg


def run_training(job: str | JobConfig, workspace_of: Callable[[JobConfig], str], seed: int | None = None,
                 steps: int | None = None, stall_timeout: float | None = None) -> int:
    """Train ``job``; ``workspace_of(cfg)`` names the output folder.  Returns the exit code."""
    world = mpi_world()
    if world is None:
        cfg = _prepare(job, seed)
        workspace = workspace_of(cfg)
        os.makedirs(workspace, exist_ok=True)
        Trainer(cfg, workspace, SerialRuntime(cfg, cfg.proto.seed, workspace), train_steps=steps).run()
        return 0
    return _run_parallel(world, job, workspace_of, seed, steps, stall_timeout)


def _run_parallel(world, job, workspace_of, seed, steps, stall_timeout) -> int:
    from singa_mpi.comm import Watchdog
    from singa_mpi.parallel.runtime import ParallelRuntime

    # -- phase 1: every rank reads, validates and plans alone; then one vote
    runtime, error = None, None
    try:
        cfg = _prepare(job, seed)
        _check_cluster(cfg, world.size)
        workspace = workspace_of(cfg)
        runtime = ParallelRuntime(cfg, cfg.proto.seed, workspace, world)
        runtime.plan_all(["train"] + (["test"] if cfg.proto.test_steps > 0 else [])
                         + (["val"] if cfg.proto.validate_steps > 0 else []))
    except SingaError as err:
        error = (str(err), err.exit_code)
    verdicts = world.allgather_object(error)
    failed = [(rank, v) for rank, v in enumerate(verdicts) if v is not None]
    if failed:
        rank, (message, code) = failed[0]
        if world.rank == 0:
            where = "" if len(failed) == world.size else f" (on rank {rank})"
            print(f"singa-mpi: error{where}: {message}", file=sys.stderr, flush=True)
        return code
    # -- phase 2: communication has started; any failure aborts the whole job
    watchdog = None
    try:
        if world.rank == 0:
            os.makedirs(workspace, exist_ok=True)
        world.barrier()
        trainer = Trainer(cfg, workspace, runtime, train_steps=steps)
        runtime.check_agreement()
        if stall_timeout:
            watchdog = Watchdog(world, stall_timeout)
            watchdog.start()
        trainer.run()
        if watchdog is not None:
            watchdog.stop()
        world.barrier()
        return 0
    except SingaError as err:
        _abort(world, f"{err}", err.exit_code)
    except BaseException as err:  # a bug or a signal: show where, then end every rank
        detail = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        _abort(world, f"{type(err).__name__}: {err}\n{detail}", EXIT_ABORT)
    return EXIT_ABORT


def _abort(world, message: str, code: int) -> None:
    step = world.step
    os.write(2, f"singa-mpi: rank {world.rank}: error at step {step}: {message}\n".encode())
    world.abort(code)


def _check_cluster(cfg: JobConfig, size: int) -> None:
    cluster = cfg.proto.cluster
    if cluster.HasField("nworkers_per_group") and cluster.nworkers_per_group != size:
        raise ConfigError(
            f"{cfg.where('cluster', 'nworkers_per_group')}: cluster.nworkers_per_group = "
            f"{cluster.nworkers_per_group}: expected the number of MPI ranks ({size}); "
            f"launch with mpirun -n {cluster.nworkers_per_group} or change the job")
    if cluster.nworker_groups > 1 or cluster.nserver_groups > 1 or cluster.server_worker_separate:
        raise ConfigError(
            f"{cfg.where('cluster')}: cluster: several worker/server groups are not supported yet: "
            f"expected nworker_groups: 1, nserver_groups: 1, server_worker_separate: false")


def run_test(job: str, workspace_of: Callable[[JobConfig], str], checkpoints: list[str] | None = None) -> int:
    """Load parameters from checkpoints (default: the newest in the workspace) and test."""
    cfg = _prepare(job, None)
    if cfg.proto.test_steps <= 0:
        raise ConfigError(f"{cfg.path}: test_steps = {cfg.proto.test_steps}: expected test_steps > 0 for `test`")
    workspace = workspace_of(cfg)
    paths = checkpoints or [checkpoint.newest(workspace)]
    if paths == [None]:
        raise DataError(f"{workspace}: no checkpoint found: expected `--checkpoint FILE` or a trained workspace")
    runtime = SerialRuntime(cfg, cfg.proto.seed, workspace)
    trainer = Trainer(cfg, workspace, runtime)
    values = {}
    for path in paths:
        values.update(checkpoint.read(path)[1])  # later files override earlier ones (SINGA)
    for param in trainer.test_net.params:
        if param.name not in values:
            raise DataError(f"{paths[-1]}: no parameter {param.name!r} (shape {param.logical_shape}) "
                            f"in the checkpoint(s)")
        if values[param.name].shape != param.logical_shape:
            raise DataError(f"{paths[-1]}: parameter {param.name!r} has shape {values[param.name].shape}, "
                            f"the net expects {param.logical_shape}")
        param.data[...] = values[param.name][param.shard_index()]
    trainer.evaluate(trainer.test_net, cfg.proto.test_steps, "test", cfg.proto.step)
    return 0
