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
import math
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


def _trains_as_serial(world, text: str, workspace: str, label: str) -> None:
    """The job partitioned over the world and alone in one process: the same losses every step and
    the same final params (within RTOL), on every rank."""
    parallel, serial = oracle.partitioned(text, workspace, world), oracle.serial(text, workspace)
    problems = oracle.compare_losses(oracle.train(parallel), oracle.train(serial), RTOL, STEPS)
    problems += oracle.compare_checkpoints(oracle.snapshot(parallel, STEPS), oracle.snapshot(serial, STEPS), RTOL,
                                           state=False)
    agree(world, not problems, label + "; ".join(problems))


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
    _trains_as_serial(world, text, workspace, f"{scheme} batch {batch}: ")


class _RowKernels:
    """Made-up kernel times (per output number), the same on every rank: the choice is deterministic."""

    def of(self, the_plan, sub):
        from singa_mpi.cost.kernels import KernelTime

        t = 1e-6 * math.prod(sub.out_shape)
        return KernelTime(t, t)


@pytest.mark.parametrize("sync_bandwidth", [1e5, 1e12])
def test_automatic_partitioning_matches_serial(world, sync_bandwidth):
    """`partition_dim` chosen by the cost model (a dear param sync pushes layers onto features, a cheap
    one keeps the batch): whatever it chooses trains the serial numbers."""
    from google.protobuf import text_format

    from singa_mpi.cost.auto import choose, with_dims
    from singa_mpi.cost.rates import Link, Rates
    from singa_mpi.planner import ALLREDUCE

    tmp = os.environ["SINGA_MPI_TEST_TMP"]
    data = nets.make_data(os.path.join(tmp, f"data_auto_r{world.rank}.h5"), 64, (12,), 5)
    text = nets.mlp(data, 4 * world.size + 1, "data", world.size)
    rates = Rates(1e10, Link(1e-9, 1e12), Link(1e-9, sync_bandwidth), Link(1e-9, 1e12), "test")
    choice = choose(nets.job(text), world.size, ALLREDUCE, _RowKernels(), rates)
    chosen = text_format.MessageToString(with_dims(nets.job(text), choice.dims).proto)
    workspace = os.path.join(tmp, f"ws_auto_{int(sync_bandwidth)}_r{world.rank}")
    _trains_as_serial(world, chosen, workspace, f"auto {choice.dims}: ")


def test_a_layer_with_fewer_outputs_than_ranks_splits_over_some_of_them(world):
    """fc3 has 2 outputs: on 3 or 4 ranks it is split over the first 2 (one output each), its
    neighbours over all; the loss still sees every class score of its rows."""
    tmp = os.environ["SINGA_MPI_TEST_TMP"]
    data = nets.make_data(os.path.join(tmp, f"data_subset_r{world.rank}.h5"), 64, (12,), 2)
    one = "partition_dim: 1"
    layers = [nets._data_layer(data, 4 * world.size + 1, (12,)), nets._ip("fc1", "data", 16, one),
              nets._act("act1", "fc1", "kSTanh", one), nets._ip("fc2", "act1", 8, one), nets._act("act2", "fc2", pdim=one),
              nets._ip("fc3", "act2", 2, one), nets._loss("fc3")]
    text = nets.job_text(layers, STEPS)
    workspace = os.path.join(tmp, f"ws_subset_r{world.rank}")
    _trains_as_serial(world, text, workspace, "fc3 on a subset: ")
