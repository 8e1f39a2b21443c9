"""The ``test`` command: a trained workspace's (or given) checkpoints through the test phase once,
partitioned like training when launched on several ranks, whichever framework trained them (the
launch runs every rank as a worker of one group: :func:`singa_mpi.launcher.describe.read_job`)."""
from __future__ import annotations

import os
from typing import Callable

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.config.load import JobConfig
from singa_mpi.launcher.options import TEST, Request, RunOptions
from singa_mpi.launcher.run import launch
from singa_mpi.trainer import Trainer

TEST_RESULTS = "test_results.jsonl"  # one line per `singa-mpi test` run, in the workspace


def run_test(job: str, workspace_of: Callable[[JobConfig], str], checkpoints: list[str] | None = None,
             workers: int | None = None, spelling: dict[str, str] | None = None, check_memory: bool = True) -> int:
    """Load parameters from checkpoints (default: the newest good one in the workspace) and run the
    test phase once, partitioned like training when launched on several ranks (``workers``:
    overrides cluster.nworkers_per_group; ``spelling``: the caller's words for ``--checkpoint`` and
    ``--no-check-memory``; ``check_memory``: refuse a test predicted not to fit a rank's memory first)."""
    options = RunOptions(workers=workers, spelling=dict(spelling or {}))
    options.check_memory = check_memory
    request = Request(job, workspace_of, options, command=TEST, checkpoints=tuple(checkpoints or ()))

    def test(trainer: Trainer, ckpt: checkpoint.Checkpoint) -> int:
        used = ", ".join(checkpoints) if checkpoints else ckpt.path
        trainer.log(f"testing {used} (step {ckpt.step})")
        # metrics.jsonl is the training's record: a test run's result goes to its own file
        trainer.metrics_path = os.path.join(trainer.workspace, TEST_RESULTS)
        trainer.tags = {"checkpoint": used}
        trainer.restore(ckpt, full=False)
        trainer.evaluate(trainer.test_net, trainer.job.test_steps, "test", ckpt.step)
        return 0

    return launch(request, test)
