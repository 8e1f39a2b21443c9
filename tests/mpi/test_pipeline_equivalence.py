"""Pipelined steps train the serial numbers: GPipe, 1F1B, ZB and interleaved over 1, 2, 3 and 8 micro-batches.

Every rank trains the job pipelined over the world and alone in one process (the serial oracle, which
runs whole batches): the per-step losses and the final params must agree within a relative 1e-5, with
a batch the micro-batches divide and one they do not.  Layouts: the MLP (with and without dropout) and
the (smooth) convnet in contiguous stages, one per worker, and the MLP whose first stage is split on
the batch over every worker, and the MLP with a middle stage split over every worker (on the batch or
the features) between single-worker stages, and the MLP and the convnet with each layer placed at
random (whole on a worker, split on the batch or the features), and the convnet in stages with the
layer at the first cut split over every worker (its exchanges sent as messages: the stages stay
apart); interleaved also with the MLP's layers dealt round robin over the workers (a
worker holding runs of layers apart).  On one rank there is no pipeline (a single stage): the jobs then run unpipelined, as
``neuralnet.pipeline`` says, and must still agree.
"""
import os

import pytest

import nets
import oracle
from conftest import agree

RTOL = 1e-5
STEPS = 8
MICRO_BATCHES = [1, 2, 3, 8]
SCHEDULES = ["gpipe", "1f1b", "zb", "interleaved"]


def _trains_as_serial(world, text: str, label: str) -> None:
    workspace = oracle.scratch(f"ws_pipe_{label}", world.rank)
    parallel, serial = oracle.partitioned(text, workspace, world), oracle.serial(text, workspace)
    problems = oracle.compare_losses(oracle.train(parallel), oracle.train(serial), RTOL, STEPS)
    problems += oracle.compare_checkpoints(oracle.snapshot(parallel, STEPS), oracle.snapshot(serial, STEPS), RTOL,
                                           state=False)
    parallel.runtime.close()  # its last sends and communicators (MPICH counts what is left at exit)
    agree(world, not problems, f"{label}: " + "; ".join(problems))


def _data(world, shape: tuple[int, ...]) -> str:
    tmp = os.environ["SINGA_MPI_TEST_TMP"]
    return nets.make_data(os.path.join(tmp, f"pipe_data_{len(shape)}_r{world.rank}.h5"), 64, shape, 5)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("micro", MICRO_BATCHES)
@pytest.mark.parametrize("batch", [16, 19])
def test_pipelined_mlp_matches_serial(world, schedule, micro, batch):
    text = nets.mlp(_data(world, (12,)), batch, "stages", world.size, steps=STEPS)
    _trains_as_serial(world, nets.pipelined(text, micro, schedule), f"mlp_{schedule}_{micro}_{batch}")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("micro", [2, 3])
def test_pipelined_hybrid_mlp_matches_serial(world, schedule, micro):
    """The first stage split on the batch over every worker (each micro-batch's rows split again)."""
    text = nets.mlp(_data(world, (12,)), 4 * world.size + 1, "stages-hybrid", world.size, steps=STEPS)
    _trains_as_serial(world, nets.pipelined(text, micro, schedule), f"hybrid_{schedule}_{micro}")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("micro", [2, 3])
@pytest.mark.parametrize("scheme", ["stages-middle", "stages-middle-feature"])
def test_pipelined_mlp_with_a_stage_split_over_every_worker_between_two_matches_serial(world, schedule, micro, scheme):
    """fc1 whole on the first worker, fc2 split on the batch (or its features) over every worker, fc3
    whole on the last: the workers meet in collectives between single-worker stages."""
    text = nets.mlp(_data(world, (12,)), 4 * world.size + 1, scheme, world.size, steps=STEPS)
    _trains_as_serial(world, nets.pipelined(text, micro, schedule), f"{scheme}_{schedule}_{micro}")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("net,seed", [("mlp", seed) for seed in range(6)] + [("convnet", seed) for seed in range(4)])
def test_pipelined_nets_placed_anywhere_match_serial(world, schedule, net, seed):
    """Each layer drawn whole on a worker, split on the batch or on features (nets.placed_anywhere),
    three micro-batches.  1F1B and ZB may be refused where a worker holds layers apart (the proof says
    so before any rank starts: tests/program/test_schedules.py); GPipe and interleaved never are."""
    from singa_mpi.errors import ConfigError
    from singa_mpi.planner import plan

    batch = 4 * world.size + 5
    placed = (nets.mlp_anywhere(_data(world, (12,)), batch, world.size, seed, steps=STEPS) if net == "mlp"
              else nets.convnet_anywhere(_data(world, (2, 8, 8)), batch, world.size, seed, steps=STEPS))
    text = nets.pipelined(placed, 3, schedule)
    if schedule in ("1f1b", "zb") and world.size > 1:
        try:
            plan(nets.job(text), world.size)
        except ConfigError as err:
            agree(world, "would deadlock" in str(err), str(err))
            return
    _trains_as_serial(world, text, f"anywhere_{net}_{schedule}_{seed}")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipelined_dropout_draws_the_serial_masks(world, schedule):
    """Masks are keyed by the rows' places in the global batch: each micro-batch drops what the whole
    batch drops there."""
    text = nets.mlp_dropout(_data(world, (12,)), 4 * world.size + 3, "stages", steps=STEPS, nranks=world.size)
    _trains_as_serial(world, nets.pipelined(text, 3, schedule), f"dropout_{schedule}")


@pytest.mark.parametrize("micro", MICRO_BATCHES)
@pytest.mark.parametrize("batch", [16, 19])
def test_interleaved_mlp_over_runs_of_layers_apart_matches_serial(world, micro, batch):
    """Layer i on worker i mod N (nets.mlp's "pipeline" layout): each worker holds runs of layers apart,
    which only the interleaved schedule (and GPipe) can order without crossing calls."""
    text = nets.mlp(_data(world, (12,)), batch, "pipeline", world.size, steps=STEPS)
    _trains_as_serial(world, nets.pipelined(text, micro, "interleaved"), f"interleaved_apart_{micro}_{batch}")


@pytest.mark.parametrize("schedule,micro", [("gpipe", 3), ("1f1b", 2), ("1f1b", 8), ("zb", 3), ("interleaved", 3),
                                            ("interleaved", 8)])
def test_pipelined_convnet_matches_serial(world, schedule, micro):
    text = nets.convnet(_data(world, (2, 8, 8)), 17, "stages", STEPS, pool="AVG", act="kSTanh", nranks=world.size)
    _trains_as_serial(world, nets.pipelined(text, micro, schedule), f"convnet_{schedule}_{micro}")


@pytest.mark.parametrize("schedule,micro", [("1f1b", 2), ("zb", 3), ("gpipe", 3), ("interleaved", 2)])
@pytest.mark.parametrize("pdim", [0, 1])
def test_pipelined_convnet_with_the_layer_at_the_cut_split_over_every_worker_matches_serial(world, schedule, micro,
                                                                                             pdim):
    """The convnet in stages, the first layer of worker 1's stage split on the batch (0) or on filters (1)
    over every worker (as ``plan --auto`` may place the CIFAR-10 convnet's conv2)."""
    text = nets.convnet(_data(world, (2, 8, 8)), 17, "stages", STEPS, pool="AVG", act="kSTanh", nranks=world.size)
    if world.size > 1:
        text = nets.split_at_cut(text, pdim)
    _trains_as_serial(world, nets.pipelined(text, micro, schedule), f"convnet_cut{pdim}_{schedule}_{micro}")
