"""Failure never hangs: a killed rank, a frozen rank, and errors on one rank end the whole job.

Each test launches a real `mpiexec -n 2 python -m singa_mpi train ...` and bounds
every wait; the job must end non-zero within the stated time and say why.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

import nets
from mpi_jobs import finish, launcher_word, mpi_env, mpiexec_command, rank_pids, wait_for_progress

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def long_job(tmp_path, data_name="data.h5", steps=100000, extra=""):
    data = tmp_path / data_name
    if not data.exists():
        nets.make_data(str(data), 256, (12,), 5)
    text = nets.mlp(str(data), 64, "data").replace("train_steps: 20", f"train_steps: {steps}")
    text = text.replace("disp_freq: 1", "disp_freq: 50") + extra
    conf = tmp_path / f"job_{data_name}.conf"
    conf.write_text(text)
    return conf


def env():
    return mpi_env()


def start(conf, tmp_path, *args):
    cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", str(conf),
                                "--workspace", str(tmp_path / "ws"), *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_sigkill_of_one_rank_ends_the_job(tmp_path):
    conf = long_job(tmp_path)
    proc = start(conf, tmp_path)
    wait_for_progress(proc, tmp_path)
    pids = rank_pids(str(conf))
    assert set(pids) == {0, 1}, pids
    killed_at = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    code, out, err = finish(proc, 30)
    assert code != 0
    assert time.monotonic() - killed_at < 30


@pytest.mark.slow
def test_sigstop_is_caught_by_the_watchdog(tmp_path):
    conf = long_job(tmp_path)
    proc = start(conf, tmp_path, "--stall-timeout", "10")
    wait_for_progress(proc, tmp_path)
    pids = rank_pids(str(conf))
    stopped_at = time.monotonic()
    os.kill(pids[1], signal.SIGSTOP)
    try:
        code, out, err = finish(proc, 60)
    finally:
        try:
            os.kill(pids[1], signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert code != 0
    assert time.monotonic() - stopped_at < 60
    assert "rank 0: stalled:" in err and "step" in err and "in layer" in err, err[-2000:]


def test_data_missing_on_one_rank_gives_its_error_and_no_hang(tmp_path):
    good = long_job(tmp_path, steps=50)
    bad_text = good.read_text().replace(str(tmp_path / "data.h5"), str(tmp_path / "missing.h5"))
    bad = tmp_path / "bad.conf"
    bad.write_text(bad_text)
    base = mpiexec_command(2)
    exe, n_flag = base[:-2], base[-2:]
    cmd = exe + ["-n", "1", sys.executable, "-m", "singa_mpi", "train", str(good), "--workspace", str(tmp_path / "ws"),
                 ":", "-n", "1", sys.executable, "-m", "singa_mpi", "train", str(bad),
                 "--workspace", str(tmp_path / "ws")]
    del n_flag
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "rank 1" in proc.stderr and "missing.h5" in proc.stderr, proc.stderr[-2000:]


def test_cluster_size_mismatch_is_one_line_on_rank_0(tmp_path):
    """A job whose layers are placed on 3 workers, launched on 2: one line, from rank 0, naming the layer."""
    conf = long_job(tmp_path, steps=5, extra="cluster { nworkers_per_group: 3 }\n")
    conf.write_text(conf.read_text().replace('name: "loss" type: kSoftmaxLoss',
                                             'name: "loss" type: kSoftmaxLoss partition_dim: -1 location: 2'))
    proc = subprocess.run(mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", str(conf),
                                                "--workspace", str(tmp_path / "ws")],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, proc.stderr
    assert "layer 'loss': location = 2: expected a worker below 2, the number of MPI ranks" in errors[0]
    assert "nworkers_per_group is 3" in errors[0] and f"launch with {launcher_word()} -n 3" in errors[0]


# ------------------------------------------------------------------ errors at the first step (#36)

def _store(tmp_path, case: str) -> str:
    """An HDF5 store with one fault the input or loss layer finds when it first reads (``good``: none)."""
    import h5py
    import numpy as np

    path = tmp_path / f"{case}.h5"
    if case == "empty":
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=np.zeros((0, 12), np.float32))
            f.create_dataset("label", data=np.zeros(0, np.int32))
    elif case == "no-labels":
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=np.zeros((256, 12), np.float32))
    else:  # records of 7 values for shape 12; labels of 50 classes for a net of 5
        nets.make_data(str(path), 256, (7,) if case == "shape" else (12,), 50 if case == "labels" else 5)
    return str(path)


def _job(tmp_path, store: str, name: str, extra: str = ""):
    conf = tmp_path / f"{name}.conf"
    conf.write_text(nets.mlp(store, 64, "data").replace("train_steps: 20", "train_steps: 5") + extra)
    return conf


FIRST_STEP_FAULTS = {  # case: what the one line says
    "empty": "empty HDF5 store",
    "shape": "records of shape (7,), but store_conf.shape is (12,)",
    "labels": "expected a class index in 0..4 (5 classes), in the first batch of layer 'data' read from",
    "no-labels": "has no labels",
    "checkpoint": "/rbm1/checkpoint/step10-worker0' not found: ",
}


@pytest.mark.parametrize("case", sorted(FIRST_STEP_FAULTS))
def test_an_error_every_rank_meets_at_the_first_step_is_one_line_from_rank_0(tmp_path, case):
    """Bad data or a missing checkpoint_path, seen by every rank: rank 0 prints one line, every rank
    exits with the error's code (3), and no rank calls MPI_Abort (no launcher banner)."""
    if case == "checkpoint":
        conf = _job(tmp_path, _store(tmp_path, "good"), case,
                    f'checkpoint_path: "{tmp_path}/rbm1/checkpoint/step10-worker0"\n')
    else:
        conf = _job(tmp_path, _store(tmp_path, case), case)
    proc = subprocess.run(mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", str(conf),
                                                "--workspace", str(tmp_path / "ws")],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("singa-mpi: error: "), proc.stderr[-2000:]
    assert FIRST_STEP_FAULTS[case] in lines[0], lines[0]
    assert not (tmp_path / "ws" / "metrics.jsonl").exists()  # nothing trained


def test_a_first_step_error_on_one_rank_names_that_rank(tmp_path):
    """One job file whose relative store path finds an empty store from rank 1's folder alone: the
    line names rank 1 and the job ends promptly with the error's code."""
    good, bad = tmp_path / "rank0", tmp_path / "rank1"
    for folder, case in ((good, "good"), (bad, "empty")):
        folder.mkdir()
        os.replace(_store(tmp_path, case), folder / "data.h5")
    conf = _job(tmp_path, "data.h5", "job")
    base = mpiexec_command(2)[:-2]
    rank = [sys.executable, "-m", "singa_mpi", "train", str(conf), "--workspace", str(tmp_path / "ws")]
    cmd = base + ["-wdir", str(good), "-n", "1", *rank, ":", "-wdir", str(bad), "-n", "1", *rank]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "rank 1" in proc.stderr and "empty HDF5 store" in proc.stderr, proc.stderr[-2000:]
