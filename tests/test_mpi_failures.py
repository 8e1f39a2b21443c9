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
from test_mpi_suites import mpi_env, mpiexec_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def rank_pids(marker: str) -> dict[int, int]:
    """PIDs of the singa_mpi processes whose command line contains ``marker``, by MPI rank."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if b"singa_mpi" not in cmdline or not any(marker.encode() in c for c in cmdline):
                continue
            environ = dict(e.split(b"=", 1) for e in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        for key in (b"PMI_RANK", b"OMPI_COMM_WORLD_RANK"):
            if key in environ:
                found[int(environ[key])] = int(pid)
    return found


def start(conf, tmp_path, *args):
    cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", str(conf),
                                "--workspace", str(tmp_path / "ws"), *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_progress(proc, tmp_path, timeout=120):
    metrics = tmp_path / "ws" / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"job ended early:\n{proc.stdout.read()}\n{proc.stderr.read()}")
        if metrics.exists() and metrics.read_text().count("\n") >= 2:
            return
        time.sleep(0.2)
    pytest.fail("no training progress within the time limit")


def finish(proc, limit):
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"job did not end within {limit}s:\n{out[-2000:]}\n{err[-2000:]}")
    return proc.returncode, out, err


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
    assert "nworkers_per_group is 3" in errors[0] and "launch with mpirun -n 3" in errors[0]
