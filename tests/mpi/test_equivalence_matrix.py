"""The wider equivalence matrix: adaptive updaters, convolution split on filters, LRN, dropout.

As in test_equivalence.py, every rank trains the job partitioned over the world
and alone, with a batch divisible by the rank count and one that is not, and
the training losses of every step (10 steps), the final params and, for the
updater cases, the updater's state arrays (assembled from node-shared chunks or
feature shards) and counters must agree within a relative ``RTOL``.

Whole trajectories stay together only while no decision of the forward pass
(a ReLU's sign, a max-pool window's choice) lies within float32 noise of its
threshold: so the convnets here are smooth (STanh, average pooling), and the
MLPs (one ReLU layer of 10 units) small enough that none does over 10 steps.
test_lockstep.py checks ReLU and max pooling one step at a time, which holds.
"""
import numpy as np
import pytest

import nets
import oracle
from conftest import agree

RTOL = 1e-5  # relative to each array's largest serial magnitude; measured: below 1e-6
STEPS = 10
LAYOUTS = {  # where the updater's state lives
    "chunks": "data",  # replicated params: node-shared chunks (or whole replicas with SINGA_MPI_SHM=0)
    "shards": "feature",  # every param split on its output features
}


def _batches(n: int) -> list[int]:
    return [4 * n, 4 * n + 1]  # divisible by the ranks, and not (n > 1)


def _check(world, name: str, text: str, state: bool) -> None:
    workspace = oracle.scratch(f"ws_{name}", world.rank)
    parallel, serial = oracle.partitioned(text, workspace, world), oracle.serial(text, workspace)
    losses, serial_losses = oracle.train(parallel), oracle.train(serial)
    problems = oracle.compare_losses(losses, serial_losses, RTOL, STEPS)
    got, want = oracle.snapshot(parallel, STEPS), oracle.snapshot(serial, STEPS)
    problems += oracle.compare_checkpoints(got, want, RTOL, state)
    if state and world.rank == 0 and not want.updater:
        problems.append("the serial run kept no updater state")
    if not np.isfinite(serial_losses).all():
        problems.append(f"serial losses not finite: {serial_losses}")
    agree(world, not problems, f"{name}: " + "; ".join(problems))


def _data(world, shape: tuple[int, ...]) -> str:
    return nets.make_data(oracle.scratch(f"matrix_data_{len(shape)}", world.rank) + ".h5", 64, shape, 5)


@pytest.mark.parametrize("rule", sorted(nets.UPDATER_RULES))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("which_batch", [0, 1])
def test_updater_state_matches_serial(world, rule, layout, which_batch):
    batch = _batches(world.size)[which_batch]
    text = nets.mlp(_data(world, (12,)), batch, LAYOUTS[layout], world.size, steps=STEPS,
                    updater=nets.updater(rule))
    _check(world, f"{rule}_{layout}_{batch}", text, state=True)


SMOOTH = {"pool": "AVG", "act": "kSTanh"}
LAYER_CASES = {
    # convolutions, activation and both poolings split on filters (channels); ip on the batch
    "conv-filters": lambda path, batch: nets.convnet(path, batch, "filters", STEPS, **SMOOTH),
    # the same with LRN (which cannot be split on channels) between them, on the batch
    "conv-filters-lrn": lambda path, batch: nets.convnet(path, batch, "filters", STEPS, lrn=True, **SMOOTH),
    "lrn-data": lambda path, batch: nets.convnet(path, batch, "data", STEPS, lrn=True, **SMOOTH),
    "lrn-hybrid": lambda path, batch: nets.convnet(path, batch, "hybrid", STEPS, lrn=True, **SMOOTH),
    # batch norm: statistics over the whole batch (summed over the workers' rows), or per own channels
    "bn-data": lambda path, batch: nets.convnet(path, batch, "data", STEPS, bn=True, **SMOOTH),
    "bn-filters": lambda path, batch: nets.convnet(path, batch, "filters", STEPS, bn=True, **SMOOTH),
    "bn-hybrid": lambda path, batch: nets.convnet(path, batch, "hybrid", STEPS, bn=True, **SMOOTH),
    # dropout masks are drawn for the global batch: every layout drops the serial run's units
    "dropout-data": lambda path, batch: nets.mlp_dropout(path, batch, "data", steps=STEPS),
    "dropout-feature": lambda path, batch: nets.mlp_dropout(path, batch, "feature", steps=STEPS),
    "dropout-hybrid": lambda path, batch: nets.mlp_dropout(path, batch, "hybrid", steps=STEPS),
}


@pytest.mark.parametrize("case", list(LAYER_CASES))
@pytest.mark.parametrize("which_batch", [0, 1])
def test_layer_matches_serial(world, case, which_batch):
    batch = _batches(world.size)[which_batch]
    shape = (12,) if case.startswith("dropout") else (2, 8, 8)
    _check(world, f"{case}_{batch}", LAYER_CASES[case](_data(world, shape), batch), state=False)
