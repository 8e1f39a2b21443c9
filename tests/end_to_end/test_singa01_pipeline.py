"""SINGA 0.1's input pipeline end to end.

* SINGA's v0.1 MNIST MLP job (kShardData -> kMnist, kLabel) trains on a DataShard that
  `singa-mpi data mnist --backend shard` makes to the very losses of SINGA's v0.3 job (kRecordInput
  on a kvfile made from the same IDX files), step by step: tests/config/singa01/ holds both jobs.
* Partitioned over 2 and 3 in-process workers, a v0.1 net reads the records of the serial run: its
  losses and params equal the serial ones, with the batch split unevenly, fc1 split on features, and
  the kLabel layer on one worker (labels moved to it and from it as "aux" exchanges).
"""
import json
import pathlib
import struct

import numpy as np
import pytest

import nets
from nets import v01_job
from singa_mpi import cli
from singa_mpi.communication.local import run_ranks
from singa_mpi.data import convert
from singa_mpi.planner.plan import partition
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.trainer import Trainer

JOBS = pathlib.Path(__file__).parents[1] / "config" / "singa01"


def write_idx(path: pathlib.Path, array: np.ndarray, magic: int) -> str:
    """An MNIST IDX file: big-endian magic and dimensions, then unsigned bytes."""
    path.write_bytes(struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
                     + array.astype(np.uint8).tobytes())
    return str(path)


def make_mnist_stores(folder: pathlib.Path) -> None:
    """Small IDX sets (40 train, 24 test images), each converted to a DataShard and to a kvfile."""
    rng = np.random.default_rng(0)
    for prefix, count, shard, kvfile in [("train", 40, "mnist_train_shard", "train_data.bin"),
                                         ("t10k", 24, "mnist_test_shard", "test_data.bin")]:
        images = write_idx(folder / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28)), 2051)
        labels = write_idx(folder / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, count), 2049)
        for out, backend in [(shard, "shard"), (kvfile, "kvfile")]:
            assert cli.main(["data", "mnist", "--images", images, "--labels", labels, "--out", str(folder / out),
                             "--backend", backend]) == 0


def train(conf: pathlib.Path, workspace: pathlib.Path) -> list[dict]:
    assert cli.main(["train", str(conf), "--workspace", str(workspace)]) == 0
    return [json.loads(line) for line in (workspace / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_v01_mnist_job_trains_to_the_v03_jobs_losses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the jobs' data paths are bare names
    make_mnist_stores(tmp_path)
    v01 = train(JOBS / "mnist_mlp_v01.conf", tmp_path / "ws01")
    v03 = train(JOBS / "mnist_mlp_v03.conf", tmp_path / "ws03")
    assert [(m["step"], m["phase"]) for m in v01] == [(m["step"], m["phase"]) for m in v03]
    assert [m["phase"] for m in v01].count("train") == 6 and "test" in {m["phase"] for m in v01}
    for a, b in zip(v01, v03):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), (a, b)
        assert a["accuracy"] == b["accuracy"], (a, b)
    losses = [m["loss"] for m in v01 if m["phase"] == "train"]
    assert len(set(losses)) == len(losses)  # it trains: every step a new loss


# ------------------------------------------------------------------ partitioned

LAYOUTS = {"batch": {}, "hybrid": {"fc1": "partition_dim: 1"},
           "label on one worker": {"label": "partition_dim: -1 location: LAST"}}


def run_serial(text: str, workspace: str) -> tuple[list[float], dict]:
    cfg = nets.job(text)
    trainer = Trainer(cfg, workspace, SerialRuntime(cfg, cfg.proto.seed, workspace), log=lambda line: None)
    trainer.run()
    return ([h["loss"] for h in trainer.history if h["phase"] == "train"],
            {p.name: p.data.copy() for p in trainer.train_net.params})


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("n", [2, 3])
def test_partitioned_runs_read_the_serial_records(tmp_path, n, layout):
    shard = str(tmp_path / "shard")
    images = np.random.default_rng(5).integers(0, 256, (17, 8, 8))
    convert.write_store(shard, "shard", images, np.random.default_rng(6).integers(0, 4, 17), pixels=True)
    fields = {key: value.replace("LAST", str(n - 1)) for key, value in LAYOUTS[layout].items()}
    text = v01_job(shard, **fields)
    serial_losses, serial_params = run_serial(text, str(tmp_path / "serial"))
    plan = partition(nets.job(text), n)
    if layout == "label on one worker":  # the labels travel as "aux": to the kLabel worker, then to the loss
        assert {(e.src_layer, e.dst_layer) for e in plan.exchanges if e.kind == "aux"} == {("data", "label"),
                                                                                           ("label", "loss")}

    def worker(comm):
        cfg = nets.job(text)
        workspace = str(tmp_path / f"ws_r{comm.rank}")
        runtime = WorkerRuntime(cfg, cfg.proto.seed, workspace, comm)
        trainer = Trainer(cfg, workspace, runtime, log=lambda line: None)
        trainer.run()
        losses = [h["loss"] for h in trainer.history if h["phase"] == "train"]
        runtime.close()
        return losses

    for losses in run_ranks(n, worker, timeout=120):
        np.testing.assert_allclose(losses, serial_losses, rtol=1e-5)
    assert len(set(serial_losses)) == len(serial_losses) and serial_params
