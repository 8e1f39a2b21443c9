"""The central promise: any partitioning on any number of ranks trains the serial numbers.

Every rank trains the job twice: partitioned over the world (the runtime under
test) and alone in one process (the serial oracle).  The per-step training
losses over 20 steps and the final parameters must agree within a relative
1e-5 (float32 summation order is the only difference).
"""
import os

import numpy as np
import pytest

import nets
from conftest import agree
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.checkpoints.snapshot import collect
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.trainer import Trainer

RTOL = 1e-5
SCHEMES = ["data", "feature", "pipeline", "shared", "hybrid", "transposed"]


def _batches(n: int) -> list[int]:
    divisible = 4 * n
    return [divisible, divisible + 1]  # divisible by the ranks, and not (n > 1)


def _train(cfg, runtime, workspace):
    trainer = Trainer(cfg, workspace, runtime, log=lambda line: None)
    trainer.run()
    losses = [h["loss"] for h in trainer.history if h["phase"] == "train"]
    ckpt = collect(trainer, trainer.train_steps)
    return losses, ckpt.params if ckpt is not None else {}


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("which_batch", [0, 1])
def test_partitioned_training_matches_serial(world, scheme, which_batch):
    tmp = os.environ["SINGA_MPI_TEST_TMP"]
    batch = _batches(world.size)[which_batch]
    shape = (2, 8, 8) if scheme == "hybrid" else (12,)
    data = nets.make_data(os.path.join(tmp, f"data_{scheme}_r{world.rank}.h5"), 64, shape, 5)
    text = nets.convnet(data, batch) if scheme == "hybrid" else nets.mlp(data, batch, scheme, world.size)
    workspace = os.path.join(tmp, f"ws_{scheme}_{batch}_r{world.rank}")

    cfg = nets.job(text)
    parallel_losses, parallel_params = _train(cfg, WorkerRuntime(cfg, cfg.proto.seed, workspace, world), workspace)
    serial_cfg = nets.job(text)
    serial_losses, serial_params = _train(serial_cfg, SerialRuntime(serial_cfg, serial_cfg.proto.seed, workspace),
                                          workspace + "_serial")

    problems = []
    if len(parallel_losses) != 20 or len(serial_losses) != 20:
        problems.append(f"expected 20 losses, got {len(parallel_losses)} and {len(serial_losses)}")
    elif not np.allclose(parallel_losses, serial_losses, rtol=RTOL, atol=0):
        worst = int(np.argmax(np.abs(np.array(parallel_losses) - serial_losses)))
        problems.append(f"loss at step {worst}: {parallel_losses[worst]!r} vs serial {serial_losses[worst]!r}")
    if world.rank == 0:
        if sorted(parallel_params) != sorted(serial_params):
            problems.append(f"params {sorted(parallel_params)} vs {sorted(serial_params)}")
        for name, value in serial_params.items():
            got = parallel_params.get(name)
            if got is None or got.shape != value.shape:
                continue
            scale = max(float(np.abs(value).max()), 1e-6)
            err = float(np.abs(got - value).max()) / scale
            if err > RTOL:
                problems.append(f"param {name}: max error {err:.2e} of its largest value")
    agree(world, not problems, f"{scheme} batch {batch}: " + "; ".join(problems))
