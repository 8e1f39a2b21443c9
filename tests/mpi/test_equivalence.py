"""The central promise: any partitioning on any number of ranks trains the serial numbers.

Every rank trains the job twice: partitioned over the world (the runtime under
test) and alone in one process (the serial oracle).  The per-step training
losses over 20 steps and the final parameters must agree within a relative
1e-5 (float32 summation order is the only difference).

Whole trajectories stay together only while no decision of the forward pass
(a ReLU's sign, a max-pool window's choice) lies within float32 noise of its
threshold, so the convnet of the hybrid scheme is smooth (STanh, average
pooling) and the MLPs (one ReLU layer of 10 units) small enough that none does
over 20 steps.  test_lockstep.py checks ReLU and max pooling one step at a
time, which holds for any net.
"""
import os

import pytest

import nets
import oracle
from conftest import agree

RTOL = 1e-5
STEPS = 20
SCHEMES = ["data", "feature", "pipeline", "shared", "hybrid", "transposed"]


def _batches(n: int) -> list[int]:
    divisible = 4 * n
    return [divisible, divisible + 1]  # divisible by the ranks, and not (n > 1)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("which_batch", [0, 1])
def test_partitioned_training_matches_serial(world, scheme, which_batch):
    tmp = os.environ["SINGA_MPI_TEST_TMP"]
    batch = _batches(world.size)[which_batch]
    shape = (2, 8, 8) if scheme == "hybrid" else (12,)
    data = nets.make_data(os.path.join(tmp, f"data_{scheme}_r{world.rank}.h5"), 64, shape, 5)
    text = (nets.convnet(data, batch, pool="AVG", act="kSTanh") if scheme == "hybrid"
            else nets.mlp(data, batch, scheme, world.size))
    workspace = os.path.join(tmp, f"ws_{scheme}_{batch}_r{world.rank}")
    parallel, serial = oracle.partitioned(text, workspace, world), oracle.serial(text, workspace)
    problems = oracle.compare_losses(oracle.train(parallel), oracle.train(serial), RTOL, STEPS)
    problems += oracle.compare_checkpoints(oracle.snapshot(parallel, STEPS), oracle.snapshot(serial, STEPS), RTOL,
                                           state=False)
    agree(world, not problems, f"{scheme} batch {batch}: " + "; ".join(problems))
