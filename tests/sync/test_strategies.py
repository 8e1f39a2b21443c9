"""Sync strategies on LocalComm threads against a serial sum and a serial update.

Each rank writes its own gradients; after ``layer_done``/``gradients_complete`` what each rank holds
(a bucket's params, or the chunks it owns) must be the sum over ranks, and after ``update`` +
``publish`` every rank must see the values one serial SGD step on the summed gradient gives.  The
last test drives whole WorkerRuntime + Trainer steps and compares the bytes the tracer records for
the sync rows with the planner's prediction, and the trained values with a serial run.
"""
import types

import numpy as np
import pytest
from google.protobuf import text_format

import nets
from singa_mpi.communication.local import run_ranks
from singa_mpi.params import Param, keyed_rng
from singa_mpi.planner import partition, syncs
from singa_mpi.planner.schedule import predicted_bytes
from singa_mpi.proto import job_pb2
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.sync.allreduce import AllreduceSync
from singa_mpi.sync.base import LocalSync, Synchronizer
from singa_mpi.sync.shared_memory import SharedMemorySync
from singa_mpi.trainer import Trainer
from singa_mpi.updaters import make_updater

SGD = "type: kSGD momentum: 0.9 weight_decay: 0.01 learning_rate { type: kFixed base_lr: 0.1 }"
STEPS = 2


def sgd():
    return make_updater(text_format.Parse(SGD, job_pb2.UpdaterProto()))


def param(name: str, shape) -> Param:
    """A whole param whose initial values every rank draws alike."""
    p = Param(job_pb2.ParamProto(name=name), tuple(shape), tuple((0, n) for n in shape))
    p.data[...] = keyed_rng(1, name).normal(size=shape)
    return p


def gradient(name: str, shape, rank: int, step: int) -> np.ndarray:
    return keyed_rng(2, name, rank, step).normal(size=shape).astype(np.float32)


def serial(name: str, shape, ranks, contribution=gradient) -> np.ndarray:
    """The values after STEPS serial SGD steps on the gradient summed over ``ranks``."""
    p, updater = param(name, shape), sgd()
    for step in range(STEPS):
        p.grad = sum(contribution(name, shape, r, step) for r in ranks).astype(np.float32)
        updater.update(step, p)
    return p.data


def layer(*params) -> types.SimpleNamespace:
    return types.SimpleNamespace(params=list(params))


# ------------------------------------------------------------------ AllreduceSync

def bucketed_params(plan, rank: int):
    """This rank's shards of the bucketed params, and how many of its layers use each."""
    params, uses, layers = {}, {}, []
    for sub in plan.on_rank(rank):
        mine = []
        for shard in sub.params:
            key = (shard.name, shard.offsets)
            if key not in params:
                params[key] = param(shard.name, shard.shape)
            uses[id(params[key])] = uses.get(id(params[key]), 0) + 1
            mine.append(params[key])
        layers.append(layer(*mine))
    return params, uses, layers


def finished_buckets(backward, params, buckets) -> list[int]:
    """After each layer of ``backward``: how many buckets have every use of every shard done."""
    left = {key: sum(params[key] in each.params for each in backward) for key in params}
    counts = []
    for each in backward:
        for key in params:
            left[key] -= params[key] in each.params
        counts.append(sum(all(left[key] == 0 for key in bucket.shards) for bucket in buckets))
    return counts


@pytest.mark.parametrize("scheme, n", [("data", 2), ("data", 3), ("shared", 3), ("data", 4)])
def test_allreduce_buckets_sum_in_backward_and_every_replica_updates_alike(tmp_path, monkeypatch, scheme, n):
    monkeypatch.setattr(syncs, "BUCKET_BYTES", 800)  # several buckets, started at different layers
    plan = partition(nets.job(nets.mlp(nets.make_data(str(tmp_path / "d.h5"), 8, (12,), 5), 7, scheme, n)), n)
    buckets = syncs.buckets(plan, "allreduce")
    assert len(buckets) > 1

    def rank(comm):
        params, uses, layers = bucketed_params(plan, comm.rank)
        sync, updater = AllreduceSync(comm, buckets, params, uses), sgd()
        backward = list(reversed([each for each in layers if each.params]))  # the last layer first
        for step in range(STEPS):
            for (name, _), p in params.items():
                p.grad[...] = gradient(name, p.grad.shape, comm.rank, step)
            started = []
            for done in backward:
                sync.layer_done(done)
                started.append(sum(r is not None for r in sync.requests))
            sync.gradients_complete()
            summed = {key: p.grad.copy() for key, p in params.items()}
            sync.update(step, updater)
            sync.publish()
        return summed, {key: p.data for key, p in params.items()}, started, finished_buckets(backward, params, buckets)

    for summed, values, started, finished in run_ranks(n, rank):
        assert started == finished  # each sum starts as soon as its params are final, in backward
        for (name, offsets), grad in summed.items():
            expected = sum(gradient(name, grad.shape, r, STEPS - 1) for r in range(n))
            np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(values[(name, offsets)], serial(name, grad.shape, range(n)), rtol=1e-5)


# ------------------------------------------------------------------ SharedMemorySync

# name -> (shape, batch rows per rank for a batch-factored param, None for a dense one): rank 1 has no
# rows of "w"; "tiny" and "b" have fewer rows (items) than 4 ranks, so some ranks own no chunk of them
SHM_PARAMS = {"w": ((5, 4), [3, 0, 2, 2]), "tiny": ((2, 3), [1, 2, 1, 3]), "b": ((2,), None), "m": ((3, 3), None)}
SILENT = 3  # this rank's backward adds nothing to "w" and "m" (finish_grad makes it zero)


def rows_of(name: str, n: int) -> list[int] | None:
    rows = SHM_PARAMS[name][1]
    return rows[:n] if rows else None


def silent(name: str, rank: int) -> bool:
    return rank == SILENT and name in ("w", "m")


def factors(name: str, shape, rank: int, step: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    a = gradient(name + "/a", (shape[0], rows), rank, step)
    return a, gradient(name + "/b", (rows, shape[1]), rank, step)


def contribution(name: str, shape, rank: int, step: int) -> np.ndarray:
    """Rank ``rank``'s gradient of ``name``: a @ b over its batch rows for a factored param."""
    rows = SHM_PARAMS[name][1]
    if silent(name, rank):
        return np.zeros(shape, np.float32)
    if rows is None:
        return gradient(name, shape, rank, step)
    a, b = factors(name, shape, rank, step, rows[rank])
    return a @ b


def contribute(p: Param, rank: int, step: int, n: int) -> None:
    """What backward does to ``p`` on ``rank``: one add_grad (factors or dense), or none."""
    p.zero_grad()
    if silent(p.name, rank):
        p.finish_grad()
    elif rows_of(p.name, n) is not None:
        p.add_grad(*factors(p.name, p.data.shape, rank, step, rows_of(p.name, n)[rank]))
    else:
        p.add_grad(contribution(p.name, p.data.shape, rank, step))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shared_memory_chunks_hold_the_sum_and_every_rank_sees_one_update(n):
    def rank(comm):
        params = [param(name, shape) for name, (shape, _) in SHM_PARAMS.items()]
        batch_rows = {id(p): rows_of(p.name, n) for p in params if rows_of(p.name, n) is not None}
        sync, updater = SharedMemorySync(comm, params, batch_rows), sgd()
        assert [p.factors is not None for p in params] == [id(p) in batch_rows for p in params]
        for step in range(STEPS):
            for p in params:
                contribute(p, comm.rank, step, n)
            sync.layer_done(layer(*params))
            sync.gradients_complete()
            chunks = [(v.name, v.lo, v.hi, v.grad.copy()) for v in sync.owned()]
            sync.update(step, updater)
            sync.publish()
            values = {p.name: p.data.copy() for p in params}
        return chunks, values

    results = run_ranks(n, rank)
    for name, (shape, _) in SHM_PARAMS.items():
        whole = sum(contribution(name, shape, r, STEPS - 1) for r in range(n)).reshape(-1)
        owned = sorted((lo, hi, grad) for chunks, _ in results for (pname, lo, hi, grad) in chunks if pname == name)
        bounds = [(lo, hi) for lo, hi, _ in owned]
        assert [lo for lo, _ in bounds] == [0] + [hi for _, hi in bounds[:-1]] and bounds[-1][1] == whole.size
        for lo, hi, grad in owned:
            np.testing.assert_allclose(grad.reshape(-1), whole[lo:hi], rtol=1e-5, atol=1e-6)
        for _, values in results:
            np.testing.assert_allclose(values[name], serial(name, shape, range(n), contribution), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ Synchronizer of all three

def test_synchronizer_runs_shared_memory_buckets_and_local_params_side_by_side():
    n = 3

    def rank(comm):
        dense, bucketed, local = param("dense", (7,)), param("bucketed", (2, 3)), param(f"local{comm.rank}", (4,))
        bucket = syncs.Bucket(0, (0, 2), (("bucketed", ((0, 2), (0, 3))),), 6)  # held by ranks 0 and 2 only
        strategies = [SharedMemorySync(comm, [dense], {})]
        if comm.rank in bucket.ranks:
            strategies.append(AllreduceSync(comm, [bucket], {bucket.shards[0]: bucketed}, {id(bucketed): 1}))
        strategies.append(LocalSync([local]))
        sync, updater = Synchronizer(strategies, comm.tracer), sgd()
        mine = [dense, local] + ([bucketed] if comm.rank in bucket.ranks else [])
        for step in range(STEPS):
            for p in mine:
                p.grad[...] = gradient(p.name, p.data.shape, comm.rank, step)
            sync.layer_done(layer(*mine))
            sync.gradients_complete()
            assert comm.tracer.direction == "params"
            sync.update(step, updater)
            sync.publish()
        return {p.name: p.data.copy() for p in mine}, len(sync.owned())

    results = run_ranks(n, rank)
    for r, (values, owned) in enumerate(results):
        np.testing.assert_allclose(values["dense"], serial("dense", (7,), range(n)), rtol=1e-5)
        np.testing.assert_allclose(values[f"local{r}"], serial(f"local{r}", (4,), [r]), rtol=1e-5)
        if r in (0, 2):
            np.testing.assert_allclose(values["bucketed"], serial("bucketed", (2, 3), [0, 2]), rtol=1e-5)
        assert owned == 1 + (r in (0, 2)) + 1  # one chunk of "dense" each (7 items over 3 ranks)


# ------------------------------------------------------------------ whole steps: bytes and values

@pytest.mark.parametrize("method", ["shared_memory", "allreduce"])
@pytest.mark.parametrize("n", [2, 3])
def test_worker_steps_move_the_predicted_bytes_and_match_the_serial_run(tmp_path, monkeypatch, n, method):
    if method == "allreduce":
        monkeypatch.setenv("SINGA_MPI_SHM", "0")
        monkeypatch.setattr(syncs, "BUCKET_BYTES", 800)
    cfg = nets.job(nets.mlp(nets.make_data(str(tmp_path / "d.h5"), 16, (12,), 5), 7, "data", n))

    def rank(comm):
        runtime = WorkerRuntime(cfg, cfg.proto.seed, str(tmp_path), comm)
        trainer = Trainer(cfg, str(tmp_path), runtime, log=lambda line: None)
        for step in range(STEPS):
            trainer.train_one_batch(step)
        values = {p.name: p.data.copy() for p in trainer.train_net.params}
        measured = {label: nbytes for label, (_, nbytes, _) in runtime.measured().items()}
        runtime.close()
        return runtime.method, measured, values, predicted_bytes(runtime.plans["train"], runtime.method)

    serial_trainer = Trainer(cfg, str(tmp_path), SerialRuntime(cfg, cfg.proto.seed, str(tmp_path)), log=lambda s: None)
    for step in range(STEPS):
        serial_trainer.train_one_batch(step)
    expected = {p.name: p.data for p in serial_trainer.train_net.params}
    for r, (used, measured, values, predicted) in enumerate(run_ranks(n, rank)):
        assert used == method
        rows = predicted[r]
        assert rows and any(rows.values())
        assert {label: measured.get(label, 0) for label in rows} == {label: STEPS * b for label, b in rows.items()}
        assert not {label: b for label, b in measured.items() if label not in rows and b}
        for name, value in expected.items():
            np.testing.assert_allclose(values[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
