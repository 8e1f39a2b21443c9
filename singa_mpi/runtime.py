"""Entry points that run a job: serially in one process, or one worker per MPI rank.

``run_training`` picks the runtime: a single process (or an MPI world of size 1)
runs the serial runtime; a larger MPI world runs the partitioned runtime of
:mod:`singa_mpi.parallel` (only that path imports mpi4py).
"""
from __future__ import annotations

import os

from singa_mpi import checkpoint
from singa_mpi.config.load import JobConfig
from singa_mpi.errors import DataError
from singa_mpi.train import SerialRuntime, Trainer


def run_training(cfg: JobConfig, workspace: str, steps: int | None = None,
                 stall_timeout: float | None = None) -> int:
    runtime = SerialRuntime(cfg, cfg.proto.seed, workspace)
    os.makedirs(workspace, exist_ok=True)
    trainer = Trainer(cfg, workspace, runtime, train_steps=steps)
    trainer.run()
    return 0


def run_test(cfg: JobConfig, workspace: str, checkpoints: list[str] | None = None) -> int:
    """Load parameters from checkpoints (default: the newest in the workspace) and test."""
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
            raise DataError(f"{paths[-1]}: no parameter {param.name!r} (shape {param.logical_shape}) in the checkpoint(s)")
        if values[param.name].shape != param.logical_shape:
            raise DataError(f"{paths[-1]}: parameter {param.name!r} has shape {values[param.name].shape}, "
                            f"the net expects {param.logical_shape}")
        param.data[...] = values[param.name][param.shard_index()]
    trainer.evaluate(trainer.test_net, cfg.proto.test_steps, "test", cfg.proto.step)
    return 0
