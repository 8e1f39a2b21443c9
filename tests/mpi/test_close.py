"""A run leaves no MPI object behind: bridge sends completed, group communicators and windows freed."""
import os

import nets
from conftest import agree
from singa_mpi.communication.mpi import MPI
from singa_mpi.runtimes.exchange import ExchangeLayer
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.trainer import Trainer


def test_close_completes_sends_and_frees_what_the_run_made(world):
    tmp = os.environ["SINGA_MPI_TEST_TMP"]
    data = nets.make_data(os.path.join(tmp, f"close_r{world.rank}.h5"), 32, (12,), 5)
    scheme = "pipeline" if world.size > 1 else "data"
    cfg = nets.job(nets.mlp(data, 8, scheme, world.size))
    group = world.split(0, world.rank)  # as the launcher does: the runtime gets its group's communicator
    runtime = WorkerRuntime(cfg, cfg.proto.seed, os.path.join(tmp, f"ws_close_r{world.rank}"), group)
    trainer = Trainer(cfg, runtime.workspace, runtime, log=lambda line: None)
    for step in range(2):
        trainer.train_one_batch(step)
    exchanges = [layer for layer in trainer.train_net.layers if isinstance(layer, ExchangeLayer)]
    runtime.close()
    problems = []
    if any(layer._requests for layer in exchanges):
        problems.append("a send request is still pending after close")
    if group.comm != MPI.COMM_NULL:
        problems.append("the group communicator was not freed")
    if group._subs or group._windows:
        problems.append(f"{len(group._subs)} sub-communicators and {len(group._windows)} windows left")
    if world.size > 1 and scheme == "pipeline" and not exchanges:
        problems.append("the pipeline plan has no exchange on this rank")
    agree(world, not problems, "; ".join(problems))
