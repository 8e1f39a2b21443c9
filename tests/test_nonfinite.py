"""A NaN or an infinity stops training at the step it appears, with one line, exit code 5 and no
checkpoint of it; ``--no-check-finite`` lets the run go on.

Serial runs go through the CLI in a subprocess; the MPI runs launch ``mpiexec -n 2`` with a data-
and a feature-partitioned net.  The data are read in file order (no shuffle): with batches of 64,
record 104 is row 40 of global batch 1, i.e. step 1, on rank 1 when the batch is split over 2 ranks.
"""
import glob
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import nets
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.communication.local import run_ranks
from singa_mpi.errors import NonFiniteError
from singa_mpi.params import Param
from singa_mpi.planner import syncs
from singa_mpi.proto import job_pb2
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.trainer import Trainer
from singa_mpi.sync.allreduce import AllreduceSync
from singa_mpi.sync.base import FrozenParams, LocalSync, Synchronizer, first_nonfinite
from singa_mpi.sync.shared_memory import SharedMemorySync
from mpi_jobs import mpi_env, mpiexec_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD_RECORD, BAD_VALUE, BAD_STEP = 104, 3, 1  # row 40 of global batch 1 (batches of 64, file order)


# ------------------------------------------------------------------ jobs and runs

def store(tmp_path, value=None, name="data.h5") -> str:
    """256 records of 12 values, 5 classes; ``value`` written at BAD_RECORD, BAD_VALUE."""
    path = nets.make_data(str(tmp_path / name), 256, (12,), 5)
    if value is not None:
        with h5py.File(path, "r+") as f:
            f["data"][BAD_RECORD, BAD_VALUE] = value
    return path


def job(tmp_path, data: str, scheme: str = "data", lr: float = 0.05, test_data: str | None = None) -> str:
    """The 12-16-10-5 MLP of tests/nets.py, file order, a checkpoint and a progress line every step;
    ``test_data``: a test phase reading that store at step 0."""
    text = nets.mlp(data, 64, scheme).replace("shuffle: true", "")
    text = text.replace("disp_freq: 1", "disp_freq: 1 checkpoint_freq: 1").replace("base_lr: 0.05", f"base_lr: {lr}")
    if test_data is not None:
        train_layer = next(line for line in text.splitlines() if 'name: "data"' in line)
        test_layer = train_layer.replace(data, test_data).replace("kRecordInput", "kRecordInput include: kTest")
        text = text.replace(train_layer, train_layer.replace("kRecordInput", "kRecordInput include: kTrain")
                            + "\n" + test_layer)
        text = text.replace("disp_freq: 1", "disp_freq: 1 test_steps: 1 test_freq: 5")
    path = tmp_path / f"job_{scheme}.conf"
    path.write_text(text)
    return str(path)


# `python -m singa_mpi` for which every store is too big to be decoded whole (and looked at whole before
# training): the batches the training reads are looked at one by one, as a store over MEMORY_LIMIT's are
BIG_STORES = ("import runpy; import singa_mpi.data.stores as stores; stores.MEMORY_LIMIT = 0; "
              "runpy.run_module('singa_mpi', run_name='__main__', alter_sys=True)")


def train(conf: str, workspace, *extra, ranks: int = 1, steps: int = 6,
          big_stores: bool = False) -> subprocess.CompletedProcess:
    launch = mpiexec_command(ranks) if ranks > 1 else []
    python = [sys.executable, "-c", BIG_STORES] if big_stores else [sys.executable, "-m", "singa_mpi"]
    cmd = launch + python + ["train", conf, "--workspace", str(workspace), "--steps", str(steps), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=240)


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if "error" in line.lower()]


def checkpoint_steps(workspace) -> list[int]:
    return sorted(step for step, _ in checkpoint.listed(str(workspace)))


def all_finite(path: str) -> bool:
    return all(np.isfinite(value).all() for value in checkpoint.read(path).params.values())


def assert_stopped(result, workspace, step: int, phase: str = "train") -> str:
    """Exit 5, one error line naming the step and phase, no traceback, no checkpoint past ``step``
    (the one written before it is the newest) and every checkpoint finite.  Returns the line."""
    assert result.returncode == NonFiniteError.exit_code, result.stderr[-3000:]
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Abort" not in result.stderr, result.stderr[-3000:]
    assert f"non-finite value at step {step} ({phase})" in lines[0], lines[0]
    steps = checkpoint_steps(workspace)
    assert steps and steps[-1] == step, (steps, lines[0])
    assert f"the newest checkpoint is still {checkpoint.checkpoint_path(str(workspace), step)}" in lines[0]
    for path in glob.glob(os.path.join(str(workspace), "checkpoint", "*.h5")):
        assert all_finite(path), path
    return lines[0]


def losses(workspace) -> dict[int, float]:
    with open(os.path.join(str(workspace), "metrics.jsonl")) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    return {e["step"]: e["loss"] for e in entries if e["phase"] == "train"}


# ------------------------------------------------------------------ the gradient scan of each strategy

def param(name: str, shape) -> Param:
    p = Param(job_pb2.ParamProto(name=name), tuple(shape), tuple((0, n) for n in shape))
    p.data[...] = 1
    return p


def test_first_nonfinite_names_the_param_and_ignores_a_sum_that_only_overflows():
    big, bad, fine = param("big", (4,)), param("bad", (3,)), param("fine", (2,))
    big.grad[...] = 3e38  # finite values whose float32 sum is inf
    fine.grad[...] = 1
    bad.grad[...] = [1, np.inf, 2]
    assert first_nonfinite([big, fine]) is None
    assert first_nonfinite([big, bad, fine]) is bad
    bad.data[1] = np.nan
    assert first_nonfinite([fine, bad], values=True) is bad and first_nonfinite([fine, bad]) is bad
    frozen = FrozenParams([bad])
    assert frozen.nonfinite_grad() is None  # never applied
    assert Synchronizer([frozen, LocalSync([fine]), LocalSync([bad])]).nonfinite_grad() is bad


@pytest.mark.parametrize("poisoned, on_rank, expected", [
    ("dense", 0, [None, "dense"]),  # item 5 of 7: in rank 1's chunk (4..6) of the node-shared sum
    ("bucketed", 1, ["bucketed", "bucketed"]),  # Allreduce: every holder gets the sum
    ("local1", 1, [None, "local1"]),
    (None, None, [None, None]),
])
def test_each_rank_finds_the_nonfinite_sums_it_is_about_to_apply(poisoned, on_rank, expected):
    n = 2

    def rank(comm):
        dense, bucketed, local = param("dense", (7,)), param("bucketed", (2, 3)), param(f"local{comm.rank}", (4,))
        bucket = syncs.Bucket(0, (0, 1), (("bucketed", ((0, 2), (0, 3))),), 6)
        sync = Synchronizer([SharedMemorySync(comm, [dense], {}),
                             AllreduceSync(comm, [bucket], {bucket.shards[0]: bucketed}, {id(bucketed): 1}),
                             LocalSync([local])], comm.tracer)
        for p in (dense, bucketed, local):
            p.grad[...] = 0.5
            if p.name == poisoned and comm.rank == on_rank:
                p.grad.reshape(-1)[-2] = np.nan
        sync.gradients_complete()
        found = sync.nonfinite_grad()
        return None if found is None else found.name

    assert run_ranks(n, rank) == expected


# ------------------------------------------------------------------ serial runs

@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_nonfinite_record_of_a_small_store_is_refused_before_training(tmp_path, value):
    """A store that the first read decodes whole is looked at whole first: exit 3, one line, no step."""
    result = train(job(tmp_path, store(tmp_path, value)), tmp_path / "ws")
    assert result.returncode == 3, result.stderr[-3000:]
    lines = error_lines(result)
    assert lines == [f"singa-mpi: error: layer 'data': {tmp_path / 'data.h5'}: record {BAD_RECORD}, value "
                     f"{BAD_VALUE} is {float(value)}: expected finite numbers (training would stop at the step that "
                     f"reads it): clean the store (or pass --no-check-finite to train on it anyway)"], result.stderr
    assert not checkpoint_steps(tmp_path / "ws")


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_nonfinite_record_of_a_big_store_stops_the_run_naming_layer_and_record(tmp_path, value):
    """A store too big to be decoded whole: the step that reads the record stops the run."""
    result = train(job(tmp_path, store(tmp_path, value)), tmp_path / "ws", big_stores=True)
    line = assert_stopped(result, tmp_path / "ws", BAD_STEP)
    assert f"input layer 'data': record {BAD_RECORD} of {tmp_path / 'data.h5'}, value {BAD_VALUE} is " \
           f"{float(value)} in the store" in line
    assert "--no-check-finite" in line
    assert losses(tmp_path / "ws").keys() == {0}  # no progress line for the bad step


def test_no_check_finite_trains_on_through_the_nan(tmp_path):
    result = train(job(tmp_path, store(tmp_path, np.nan)), tmp_path / "ws", "--no-check-finite")
    assert result.returncode == 0, result.stderr[-3000:]
    assert np.isnan(losses(tmp_path / "ws")[BAD_STEP])
    assert checkpoint_steps(tmp_path / "ws")[-1] == 6


def first_nonfinite_step(workspace) -> int:
    """The first step whose loss, or whose updated values (the next step's checkpoint), is not finite."""
    bad_loss = [step for step, loss in losses(workspace).items() if not np.isfinite(loss)]
    bad_values = [step - 1 for step in checkpoint_steps(workspace)
                  if not all_finite(checkpoint.checkpoint_path(str(workspace), step))]
    return min(bad_loss + bad_values)


@pytest.mark.slow
def test_a_diverging_learning_rate_stops_at_the_first_nonfinite_step(tmp_path):
    conf = job(tmp_path, store(tmp_path), lr=1e6)
    unchecked = train(conf, tmp_path / "unchecked", "--no-check-finite", steps=10)
    assert unchecked.returncode == 0, unchecked.stderr[-3000:]
    first = first_nonfinite_step(tmp_path / "unchecked")
    result = train(conf, tmp_path / "ws", steps=10)
    line = assert_stopped(result, tmp_path / "ws", first)
    assert "loss layer 'loss': loss = nan" in line or "param 'w_fc" in line, line
    assert "lower learning rate" in line
    assert "warning" not in result.stderr  # numpy's overflow warnings give way to the one line


def test_a_nan_in_the_test_store_stops_the_test_phase(tmp_path):
    """Tests at steps 0 and 5 read one batch each: records 0..63, then 64..127 (of a big store: a small
    one is refused before training, as the train phase's)."""
    conf = job(tmp_path, store(tmp_path), test_data=store(tmp_path, np.nan, "test.h5"))
    refused = train(conf, tmp_path / "small")
    assert refused.returncode == 3 and f"{tmp_path / 'test.h5'}: record {BAD_RECORD}, value" in refused.stderr
    result = train(conf, tmp_path / "ws", big_stores=True)
    line = assert_stopped(result, tmp_path / "ws", 5, "test")
    assert f"input layer 'data': record {BAD_RECORD} of {tmp_path / 'test.h5'}" in line, line


def test_an_update_that_overflows_stops_before_the_next_checkpoint(tmp_path):
    """A bias at 3e38 with weight decay: finite gradients (3e35), but lr 1e6 makes the value -inf."""
    conf = job(tmp_path, store(tmp_path), lr=1e6)
    text = open(conf).read().replace("kConstant value: 0.01", "kConstant value: 3e38", 1)
    open(conf, "w").write(text)
    line = assert_stopped(train(conf, tmp_path / "ws"), tmp_path / "ws", 0)
    assert "param 'b_fc1' (layer 'fc1') holds -inf after the update (its gradient was finite)" in line, line


def test_a_nonfinite_gradient_is_named_with_its_layer_before_the_update(tmp_path):
    """In process: the sums of step 2 come back with a NaN in fc2's weight gradient."""
    cfg = nets.job(open(job(tmp_path, store(tmp_path))).read(), "job.conf")
    trainer = Trainer(cfg, str(tmp_path / "ws"), SerialRuntime(cfg, cfg.proto.seed, str(tmp_path / "ws")),
                      log=lambda line: None, train_steps=6)
    trainer.live_bar = False
    sync = trainer.runtime.sync()
    weight = next(p for p in sync.owned() if p.name == "w_fc2")
    summed = sync.gradients_complete

    def poisoned_at_step_2():
        summed()
        if trainer.runtime.tracer.step == 2:
            weight.grad[1, 2] = np.nan

    sync.gradients_complete = poisoned_at_step_2
    with pytest.raises(NonFiniteError) as caught:
        trainer.run()
    assert str(caught.value).startswith("non-finite value at step 2 (train): gradient of param 'w_fc2' "
                                        "(layer 'fc2') holds nan: stopped without checkpointing it")
    assert checkpoint_steps(tmp_path / "ws") == [0, 1, 2]
    assert not np.isfinite(weight.data).all()  # the update ran, but no checkpoint keeps it


# ------------------------------------------------------------------ mpiexec -n 2

@pytest.mark.parametrize("scheme", ["data", "feature"])
def test_two_ranks_stop_together_and_rank_0_prints_once(tmp_path, scheme):
    result = train(job(tmp_path, store(tmp_path, np.nan), scheme), tmp_path / "ws", ranks=2, big_stores=True)
    line = assert_stopped(result, tmp_path / "ws", BAD_STEP)
    assert f"input layer 'data': record {BAD_RECORD} of" in line
    if scheme == "data":  # rows 32..63 of each batch are rank 1's
        assert "(train) on rank 1:" in line, line


@pytest.mark.slow
def test_two_ranks_stop_a_divergence_at_its_first_nonfinite_step(tmp_path):
    conf = job(tmp_path, store(tmp_path), lr=1e6)
    unchecked = train(conf, tmp_path / "unchecked", "--no-check-finite", ranks=2, steps=10)
    assert unchecked.returncode == 0, unchecked.stderr[-3000:]
    result = train(conf, tmp_path / "ws", ranks=2, steps=10)
    assert_stopped(result, tmp_path / "ws", first_nonfinite_step(tmp_path / "unchecked"))


def test_the_stop_line_names_the_newest_good_checkpoint_not_a_damaged_newer_file(tmp_path):
    """A non-finite stop's line said "the newest checkpoint is still .../step6.h5" of a damaged file, which
    --resume skips for step3.h5; with only damaged files it named one of them too."""
    from singa_mpi import nonfinite

    for step in (3, 6):
        checkpoint.write(checkpoint.checkpoint_path(str(tmp_path), step),
                         checkpoint.Checkpoint(step=step, params={"w": np.ones((2, 2), np.float32)}))
    with open(checkpoint.checkpoint_path(str(tmp_path), 6), "r+b") as f:
        f.seek(-9, os.SEEK_END)
        f.write(b"\xff" * 9)
    finding = nonfinite.GroupFinding(1, 7, "train", "", "loss is nan", nonfinite.LOSS)
    line = nonfinite.job_line([finding], str(tmp_path))
    assert f"(the newest checkpoint is still {checkpoint.checkpoint_path(str(tmp_path), 3)})" in line, line
    os.remove(checkpoint.checkpoint_path(str(tmp_path), 3))
    assert "(no good checkpoint: each written is damaged)" in nonfinite.job_line([finding], str(tmp_path))
