"""Lock-step equivalence: one step from the same state gives the serial step, ReLU and max pooling included.

What partitioning promises, stated exactly: from the same params and updater
state, one partitioned training step computes the serial step's loss, gradient
and update up to float32 summation order.  It does not promise that whole
trajectories stay together: where a ReLU's input or a max-pool window's two
largest inputs lie within float32 noise of each other, a run whose params
differ by rounding may decide differently, and momentum carries the difference
on.  On conf/cifar10_hybrid.conf (synthetic data, 2 ranks) w1 is 1e-7 of its
largest value from serial after 1 step, 3e-3 after 10 and 7e-2 after 91, while
every single step agrees to 5e-7; a serial run whose params are perturbed by
1e-7 parts from serial just as far, and with STanh for ReLU and average for
max pooling neither parts (3e-7 after 50 steps).  ``tests/mpi/drift.py``
measures all of this (``--perturb``, ``--smooth``).

So here every rank walks the serial run along its trajectory and, before each
of ``STEPS`` steps, loads the serial state (params, momentum, data positions)
into the partitioned run (checked bit for bit); then both take the step, and
the step's loss, the params and the momentum history after it (m·h - lr·g: the
update, at full float32 precision, unlike a difference of params) must agree
within ``RTOL`` of each array's largest serial magnitude.
"""
import pytest

import nets
import oracle
from conftest import agree

RTOL = 1e-5  # measured: below 4e-7 on 1-4 ranks (float32 summation order); one flipped decision moves a whole sample's share
STEPS = 8

JOBS = {  # momentum SGD throughout (nets.UPDATER)
    "mlp-data": lambda path, batch, n: nets.mlp(path, batch, "data", n, steps=STEPS),
    "mlp-feature": lambda path, batch, n: nets.mlp(path, batch, "feature", n, steps=STEPS),
    "mlp-hybrid": lambda path, batch, n: nets.mlp(path, batch, "hybrid", n, steps=STEPS),
    "convnet-data": lambda path, batch, n: nets.convnet(path, batch, "data", STEPS),
    "convnet-hybrid": lambda path, batch, n: nets.convnet(path, batch, "hybrid", STEPS),
    "convnet-filters": lambda path, batch, n: nets.convnet(path, batch, "filters", STEPS),
    "convnet-filters-lrn": lambda path, batch, n: nets.convnet(path, batch, "filters", STEPS, lrn=True),
    # max pooling straight after a convolution (before ReLU), as in conf/cifar10_hybrid.conf
    "cifar-hybrid": lambda path, batch, n: nets.cifar_convnet(path, batch, "hybrid", STEPS),
}
SHAPES = {"mlp": (12,), "convnet": (2, 8, 8), "cifar": (3, 16, 16)}


@pytest.mark.parametrize("job", list(JOBS))
@pytest.mark.parametrize("which_batch", [0, 1])
def test_one_step_from_the_serial_state_matches_serial(world, job, which_batch):
    batch = 4 * world.size + which_batch  # divisible by the ranks, and not (n > 1)
    kind = job.split("-")[0]
    path = nets.make_data(oracle.scratch(f"lockstep_data_{kind}", world.rank) + ".h5", 64, SHAPES[kind], 5)
    text = JOBS[job](path, batch, world.size)
    workspace = oracle.scratch(f"ws_lockstep_{job}_{batch}", world.rank)
    parallel, serial = oracle.partitioned(text, workspace, world), oracle.serial(text, workspace)
    problems = []
    for index in range(STEPS):
        state = oracle.snapshot(serial, index)
        oracle.load(parallel, state)
        loaded = oracle.snapshot(parallel, index)  # the premise: bit for bit the serial state
        problems += [f"step {index}, loaded: {problem}" for problem in oracle.compare_checkpoints(loaded, state, 0.0)]
        loss, serial_loss = oracle.step(parallel, index), oracle.step(serial, index)
        got, want = oracle.snapshot(parallel, index + 1), oracle.snapshot(serial, index + 1)
        found = oracle.compare_losses([loss], [serial_loss], RTOL, 1) + oracle.compare_checkpoints(got, want, RTOL)
        if index > 0 and got is not None and not want.updater:
            found.append("no momentum history to compare")
        problems += [f"step {index}: {problem}" for problem in found]
    agree(world, not problems, f"{job} batch {batch}: " + "; ".join(problems[:4]))
