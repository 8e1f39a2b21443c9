"""Each example job's programs are what the runtime does.

For every shipped example (as written, and with its net split on the batch and on features where
its layers allow): the programs of 1 to 4 ranks are built in one process and proved (pairs,
collectives, no deadlock) for both sync methods; then a real 2-rank training step and a test pass
run on threads (LocalComm), the tracer recording every communication call, and the calls of each
rank must be the program's, in the program's order, with the same operation, layer, peer and
bytes.  A plan the job cannot take at a rank count (a location beyond it, a layer that cannot be
split so) is skipped, but every job must yield programs and a compared step in some scheme.
"""
import dataclasses
import pathlib

import pytest

from singa_mpi import plugins
from singa_mpi.communication.local import LocalGroup, run_ranks
from singa_mpi.config.load import load_job
from singa_mpi.data.synthetic import write_synthetic
from singa_mpi.errors import ConfigError
from singa_mpi.layers.base import layer_class_of
from singa_mpi.planner import METHODS, partition
from singa_mpi.planner.schedule import step_programs, verify
from singa_mpi.algorithms import make_algorithm
from singa_mpi.program.actions import Comm, Wait
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.trainer import Trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]
SINGLE_GROUP = [p for p in sorted((ROOT / "conf").glob("*.conf"))
                if p.name not in ("digits_downpour.conf", "digits_hogwild.conf", "digits_sandblaster.conf")]
SCHEMES = ["as written", "batch", "features", "pipeline", "pipelined middle"]


def job_in_scheme(conf: pathlib.Path, scheme: str):
    """The example with its chained checkpoint dropped (one step needs no trained start) and, for
    "batch", every layer split on the batch; for "features", every layer that can be split on
    features split so, the others on the batch (many exchanges between the two); for "pipeline",
    every layer whole, the first half of the net on worker 0 and the rest on worker 1 (bridges); for
    "pipelined middle", the first third whole on worker 0, the middle third split (on features where a
    layer can be), the rest whole on worker 1, in 2 micro-batches of 1F1B (every exchange sent as
    messages, the two stages apart)."""
    cfg = load_job(conf)
    job = cfg.proto
    job.ClearField("checkpoint_path")
    job.test_steps = min(job.test_steps, 1) if job.test_steps else 0
    job.validate_steps = 0
    if scheme != "as written":
        job.neuralnet.partition_dim = 0
        layers = job.neuralnet.layer
        for index, layer in enumerate(layers):
            layer.ClearField("location")
            layer.ClearField("partition_dim")
            if scheme == "features" and layer_class_of(layer).feature_partitionable:
                layer.partition_dim = 1
            elif scheme == "pipeline":
                layer.partition_dim, layer.location = -1, (2 * index) // len(layers)
            elif scheme == "pipelined middle":
                third = (3 * index) // len(layers)
                if third == 1:
                    layer.partition_dim = 1 if layer_class_of(layer).feature_partitionable else 0
                else:
                    layer.partition_dim, layer.location = -1, third // 2
        if scheme == "pipelined middle":
            job.neuralnet.pipeline.micro_batches, job.neuralnet.pipeline.schedule = 2, "1f1b"
    return cfg


def plans_or_none(cfg, n: int, phase: str):
    try:
        return partition(cfg, n, phase)
    except ConfigError:
        return None


POINT_TO_POINT = {"Isend": "to rank", "Send": "to rank", "Recv": "from rank", "Irecv": "from rank"}


def recorded_calls(events) -> list[tuple]:
    """(layer, op, peer, bytes) of each communication span, in the order the calls began (peer: of a
    send or receive, else None); a send's wait (at the connection layer's next call) is no action
    of its own."""
    calls = sorted((e for e in events if e.cat == "comm"), key=lambda e: e.start)
    return [(e.name, e.args["op"], e.args["peer"] if e.args["op"] in POINT_TO_POINT else None, e.bytes)
            for e in calls if e.args["op"] != "Wait(Isend)"]


def program_calls(prog) -> list[tuple]:
    expected = []
    for action in prog.actions:
        if isinstance(action, Comm):
            peer = f"{POINT_TO_POINT[action.op]} {action.peer}" if action.op in POINT_TO_POINT else None
            expected.append((action.layer, action.op, peer, action.send_bytes + action.recv_bytes))
        elif isinstance(action, Wait):
            expected.append((action.layer, f"Wait({action.op})", None, 0))
    return expected


def real_step(cfg, workspace: str) -> list[dict]:
    """One training step and one test pass on 2 LocalComm ranks: each rank's recorded calls."""
    group = LocalGroup(2, timeout=60.0, record=True)

    def rank(comm):
        runtime = WorkerRuntime(cfg, cfg.proto.seed, workspace, comm)
        trainer = Trainer(cfg, workspace, runtime, log=lambda line: None)
        comm.tracer.events.clear()
        trainer.train_one_batch(0)
        train = recorded_calls(comm.tracer.events)
        test = None
        if trainer.test_net is not None:
            comm.tracer.events.clear()
            trainer.test_net.set_step(0)
            trainer.algorithm.evaluate(trainer.test_net)
            test = recorded_calls(comm.tracer.events)
        programs = {phase: net.program for phase, net in trainer.nets().items()}
        runtime.close()
        return {"train": train, "test": test, "programs": programs, "method": runtime.method}

    return run_ranks(2, rank, timeout=120.0, group=group)


@pytest.mark.slow
@pytest.mark.parametrize("conf", SINGLE_GROUP, ids=lambda p: p.name)
def test_the_programs_are_proved_and_are_what_a_2_rank_step_does(conf, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the job's relative store paths land here
    assert write_synthetic(str(conf), count=64)
    compared, exchanged = 0, 0
    with plugins.isolated():
        for scheme in SCHEMES:
            cfg = job_in_scheme(conf, scheme)
            algorithm = make_algorithm(cfg.proto.train_one_batch)
            for n in (1, 2, 3, 4):
                for phase in ("train", "test"):
                    the_plan = plans_or_none(cfg, n, phase)
                    if the_plan is None:
                        continue
                    for method in METHODS:
                        verify(the_plan, method, algorithm)  # the proof runs on the programs themselves
            train_plan = plans_or_none(cfg, 2, "train")
            if train_plan is None:
                continue
            results = real_step(cfg, str(tmp_path / f"ws-{scheme}"))
            for rank, result in enumerate(results):
                train_program = step_programs(train_plan, result["method"], algorithm)[rank]
                assert result["programs"]["train"] == train_program  # the runtime runs the pure program
                exchanged += sum(1 for c in train_program.calls() if c.by == "exchange")
                assert result["train"] == program_calls(train_program), f"{scheme}, rank {rank}"
                if result["test"] is not None:
                    test_program = step_programs(partition(cfg, 2, "test"), result["method"], algorithm)[rank]
                    assert result["test"] == program_calls(test_program), f"{scheme} test, rank {rank}"
            compared += 1
    assert compared >= 2, f"{conf.name}: fewer than 2 schemes could run on 2 ranks"
    assert exchanged > 0, f"{conf.name}: no scheme made a connection layer"


def test_a_cd_program_calls_each_rbm_exchange_once_per_gibbs_round():
    """CD-k over an RBM split on features: the top-down and negative calls of the pair's exchanges
    repeat cd_k times, each occurrence with its own key (so the proof matches the n-th calls)."""
    cfg = job_in_scheme(ROOT / "conf" / "rbm_digits_1.conf", "features")
    cfg.proto.train_one_batch.cd_conf.cd_k = 3
    algorithm = make_algorithm(cfg.proto.train_one_batch)
    the_plan = partition(cfg, 2, "train")
    prog = step_programs(the_plan, "allreduce", algorithm)[0]
    top_down = [c for c in prog.calls() if c.pass_ == "top-down"]
    negative = [c for c in prog.calls() if c.pass_ == "negative"]
    assert top_down and negative
    assert len(top_down) % 3 == 0 and len(negative) % 3 == 0
    assert len({c.key for c in prog.calls()}) == len(prog.calls())
    verify(the_plan, "allreduce", algorithm)
    assert dataclasses.replace(prog).lines()[0] == "zero-grads"
