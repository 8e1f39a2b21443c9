"""The ``test`` command: a trained workspace's (or given) checkpoints through the test phase once,
partitioned like training when launched on several ranks, whichever framework trained them."""
from __future__ import annotations

import os
import warnings
from typing import Callable

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.config.load import JobConfig, load_job
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.launcher import _launch, with_workers
from singa_mpi.trainer import Trainer

TEST_RESULTS = "test_results.jsonl"  # one line per `singa-mpi test` run, in the workspace


def run_test(job: str, workspace_of: Callable[[JobConfig], str], checkpoints: list[str] | None = None,
             workers: int | None = None) -> int:
    """Load parameters from checkpoints (default: the newest good one in the workspace) and run the
    test phase once, partitioned like training when launched on several ranks (``workers``:
    overrides cluster.nworkers_per_group)."""

    def needs_test_steps(cfg: JobConfig) -> None:
        if cfg.proto.test_steps <= 0:
            raise ConfigError(f"{cfg.path}: test_steps = {cfg.proto.test_steps}: expected test_steps > 0 for `test`")

    def test(trainer: Trainer) -> int:
        ckpt = _read_for_test(trainer.workspace, checkpoints, trainer.runtime.is_root)
        used = ", ".join(checkpoints) if checkpoints else ckpt.path
        trainer.log(f"testing {used} (step {ckpt.step})")
        # metrics.jsonl is the training's record: a test run's result goes to its own file
        trainer.metrics_path = os.path.join(trainer.workspace, TEST_RESULTS)
        trainer.tags = {"checkpoint": used}
        trainer.restore(ckpt, full=False)
        trainer.evaluate(trainer.test_net, trainer.job.test_steps, "test", ckpt.step)
        return 0

    return _launch(as_one_group(with_workers(job, workers)), workspace_of, None, None, test, check=needs_test_steps,
                   phases=["test"], catch_signals=False)


GROUP_FIELDS = ("nworker_groups", "nserver_groups", "nservers_per_group", "server_worker_separate", "sync_freq",
                "max_staleness")


def as_one_group(job):
    """``test`` needs neither servers nor several groups: the job with every launched rank a worker of
    one group (the checkpoint holds the params, whichever framework trained them)."""
    def load() -> JobConfig:
        cfg = job() if callable(job) else job if isinstance(job, JobConfig) else load_job(job)
        cluster = cfg.proto.cluster
        if cluster.nworker_groups > 1 or cluster.server_worker_separate:
            if cfg.workers is None:  # a group's count of a framework is not the launched count
                cluster.ClearField("nworkers_per_group")
            for field in GROUP_FIELDS:
                cluster.ClearField(field)
        return cfg
    return load


def _read_for_test(workspace: str, checkpoints: list[str] | None, is_root: bool) -> checkpoint.Checkpoint:
    if checkpoints:
        ckpt = checkpoint.read(checkpoints[0])
        for path in checkpoints[1:]:  # later files override earlier ones (SINGA)
            ckpt.params.update(checkpoint.read(path).params)
        return ckpt
    with warnings.catch_warnings():
        if not is_root:
            warnings.simplefilter("ignore")  # one report of a damaged file is enough
        ckpt = checkpoint.newest_good(workspace)
    if ckpt is None:
        raise DataError(f"{workspace}: no checkpoint found: expected `--checkpoint FILE` or a trained workspace")
    return ckpt
