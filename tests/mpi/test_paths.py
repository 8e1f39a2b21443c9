"""Which gradient path each param takes under MPI (the equivalence tests check the numbers).

* data parallel on one node (node-shared memory on): every inner-product weight
  is summed from its batch factors, in whole-row chunks that together cover
  it exactly once; the biases are summed densely;
* feature parallel: no param is replicated, so every param's weight-gradient
  products queue for the backward exchanges, which hold the same queue.
"""
import os

import numpy as np

import nets
from conftest import agree
from singa_mpi.runtimes.exchange import ExchangeLayer
from singa_mpi.program.actions import Comm, RunQueued
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.sync.shared_memory import SharedMemorySync
from singa_mpi.trainer import Trainer

WEIGHTS = {"w_fc1": (16, 12), "w_fc2": (10, 16), "w_fc3": (5, 10)}


def _runtime(world, scheme: str, batch: int = 9):
    tmp = os.environ["SINGA_MPI_TEST_TMP"]
    data = nets.make_data(os.path.join(tmp, f"paths_{scheme}_r{world.rank}.h5"), 32, (12,), 5)
    cfg = nets.job(nets.mlp(data, batch, scheme, world.size))
    workspace = os.path.join(tmp, f"ws_paths_{scheme}_r{world.rank}")
    runtime = WorkerRuntime(cfg, cfg.proto.seed, workspace, world)
    trainer = Trainer(cfg, workspace, runtime, log=lambda line: None)
    trainer.train_one_batch(0)  # the paths run once without error
    return runtime, trainer


def test_data_parallel_weights_are_summed_from_their_factors_in_row_chunks(world):
    runtime, _ = _runtime(world, "data")
    problems = []
    shm = next((s for s in runtime.sync().strategies if isinstance(s, SharedMemorySync)), None)
    if shm is None:
        # node-shared memory needs every rank on one node (scripts/two_nodes.sh runs this suite on two)
        shm_expected = world.size > 1 and os.environ.get("SINGA_MPI_SHM", "1") != "0" and world.on_one_node()
        if shm_expected:
            problems.append("no node-shared gradients on one node")
    else:
        factored = {p.name for p in shm.params if p.factors is not None}
        if factored != set(WEIGHTS):
            problems.append(f"factored params {sorted(factored)}, expected {sorted(WEIGHTS)}")
        for view in shm.views:
            width = WEIGHTS.get(view.name, (0, 1))[1]
            if view.name in WEIGHTS and (view.lo % width or view.hi % width):
                problems.append(f"{view.name}: chunk [{view.lo}, {view.hi}) is not whole rows of {width}")
        chunks = world.allgather_object([(v.name, v.lo, v.hi) for v in shm.views])
        for name, (rows, cols) in WEIGHTS.items():
            covered = np.zeros(rows * cols, int)
            for lo, hi in ((lo, hi) for mine in chunks for n, lo, hi in mine if n == name):
                covered[lo:hi] += 1
            if not (covered == 1).all():
                problems.append(f"{name}: the ranks' chunks cover some entries {sorted(set(covered))} times")
    agree(world, not problems, "; ".join(problems))


def test_feature_parallel_gradients_queue_for_the_backward_exchanges(world):
    runtime, trainer = _runtime(world, "feature")
    net = trainer.train_net
    queues = {id(p.queue) for p in net.params}
    exchanges = [layer for layer in net.layers if isinstance(layer, ExchangeLayer)]
    actions = list(net.program.actions)
    started = [i for i, a in enumerate(actions) if isinstance(a, Comm) and a.by == "exchange" and not a.blocking]
    problems = []
    if None in (p.queue for p in net.params):
        problems.append(f"params without a queue: {[p.name for p in net.params if p.queue is None]}")
    elif len(queues) != 1:
        problems.append(f"{len(queues)} queues, expected one per net")
    if world.size > 1 and not started:
        problems.append("a feature split made no backward exchange")
    if exchanges and id(net.queue) not in queues:
        problems.append("the net that runs the exchanges does not hold the params' queue")
    if any(not isinstance(actions[i + 1], RunQueued) for i in started):
        problems.append("the program does not compute the queued gradients while each backward exchange travels")
    leftover = [len(p.queue.items) for p in net.params if p.queue is not None]
    if any(leftover):
        problems.append(f"products left in the queue after the step: {leftover}")
    agree(world, not problems, "; ".join(problems))
