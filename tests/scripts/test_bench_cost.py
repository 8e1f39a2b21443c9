"""scripts/bench_cost.py: one configuration predicted and measured, ratio printed; auto's prediction; --in-job cut short."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_cost_prints_predicted_and_measured(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_cost.py"), "--ranks", "1", "2", "--nets",
                          "mnist_mlp", "--schemes", "data", "--repeat", "1", "--steps", "3"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = re.findall(r"n=(\d)\S* +predicted +([\d.]+) ms +measured +([\d.]+) ms +predicted/measured ([\d.]+)",
                      out.stdout)
    assert [r[0] for r in rows] == ["1", "2"], out.stdout
    for _, predicted, measured, ratio in rows:
        assert float(predicted) > 0 and float(measured) > 0
        assert abs(float(ratio) - float(predicted) / float(measured)) < 0.01



def test_auto_is_predicted_with_the_layout_the_cost_model_chose(monkeypatch):
    """--schemes auto: the prediction plans the partition_dims chosen for the run (it used to pass
    None to partitioned(), a TypeError).  The choice and the prediction are stand-ins: no kernel timing."""
    import types

    import singa_mpi.cost.model
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_cost

    chosen = []

    def layout(net, scheme, ranks):
        chosen.append((net, scheme, ranks))
        return {"the": "choice"}

    def partitioned(cfg, scheme, dims, stages):
        assert (scheme, dims, stages) == ("auto", {"the": "choice"}, 2)
        return cfg

    monkeypatch.setattr(bench_cost, "layout", layout)
    monkeypatch.setattr(bench_cost, "partitioned", partitioned)
    monkeypatch.setattr(singa_mpi.cost.model, "predict",
                        lambda plan, method, kernels, rates: types.SimpleNamespace(step=0.1))
    assert bench_cost.predicted("mnist_mlp", "auto", 2, None, None) == 0.1
    assert chosen == [("mnist_mlp", "auto", 2)]


def test_a_stop_signal_is_noted_for_the_ranks_to_agree_on():
    import signal

    sys.path.insert(0, str(ROOT / "scripts"))
    from benchkit import exit_code_of, stop_requests

    before = signal.getsignal(signal.SIGTERM)
    with stop_requests() as stops:
        os.kill(os.getpid(), signal.SIGTERM)  # noted, not raised
        assert stops == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == before
    assert (exit_code_of([]), exit_code_of(stops), exit_code_of([signal.SIGINT])) == (0, 143, 130)


@pytest.mark.slow
def test_in_job_cut_short_by_sigterm_reports_and_writes_the_rows_done(tmp_path):
    """mpiexec gets SIGTERM (a time limit) after the first row: every rank stops after the configuration
    under way, rank 0 prints the summary and writes --json; exit 143."""
    import signal

    sys.path.insert(0, str(ROOT / "scripts"))
    from benchkit import bench_env, mpiexec_command

    out = tmp_path / "rows.json"
    cmd = mpiexec_command(2) + [sys.executable, str(ROOT / "scripts" / "bench_cost.py"), "--in-job", "--nets",
                                "mnist_mlp", "cifar10_convnet", "--schemes", "data", "feature", "hybrid", "--repeat",
                                "1", "--steps", "2", "--json", str(out)]
    job = subprocess.Popen(cmd, env=dict(bench_env(), XDG_CACHE_HOME=str(tmp_path)), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        for line in job.stdout:
            if " predicted " in line and " measured " in line:
                job.send_signal(signal.SIGTERM)
                break
        rest, _ = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, rest
    assert "cut short (SIGTERM): the rows done so far" in rest
    assert "largest error where every rank has a core:" in rest
    rows = json.loads(out.read_text())
    assert 1 <= len(rows) < 6 and rows[0]["scheme"] == "data"


def in_job_on_two_ranks(monkeypatch, tmp_path, predicted, measure, repeat: int = 1) -> tuple[list, list]:
    """bench_cost.in_job on two thread ranks (run_ranks), with ``predicted`` and ``measure`` stand-ins that
    get the rank's stop list; rank 0's rows and every rank's stop list."""
    import argparse
    import threading

    from singa_mpi.communication.local import run_ranks

    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_cost

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the rates and kernel caches: none of the user's
    stops: list[list[int]] = [[], []]

    def rank_stops() -> list[int]:
        return stops[int(threading.current_thread().name.rsplit("-", 1)[1])]

    monkeypatch.setattr(bench_cost, "predicted", lambda *a: predicted(rank_stops()))
    monkeypatch.setattr(bench_cost, "measure", lambda net, scheme, steps: measure(rank_stops()))
    args = argparse.Namespace(nets=["mnist_mlp"], schemes=["data", "feature"], steps=2, repeat=repeat)
    rows: list[dict] = []
    run_ranks(2, lambda comm: bench_cost.in_job(args, rows if comm.rank == 0 else [], stops[comm.rank], comm),
              timeout=120)
    return rows, stops


def test_in_job_stops_during_the_predictions_when_asked(monkeypatch, tmp_path):
    """SIGTERM while rank 0 predicts (timing kernels): it predicts no more, and the co-runner the signal
    ended failing the prediction under way is the stop, not an error (it was a rank that raised while
    the others waited: a hang).  Nothing is measured."""
    import signal

    predictions, runs = [], []

    def predicted(stops):
        predictions.append(1)
        stops.append(signal.SIGTERM)
        raise BrokenPipeError(32, "Broken pipe")  # the co-runner the same signal ended

    rows, _ = in_job_on_two_ranks(monkeypatch, tmp_path, predicted, lambda stops: runs.append(1))
    assert (rows, len(predictions), runs) == ([], 1, [])


def test_in_job_stops_after_the_measured_run_under_way(monkeypatch, tmp_path):
    """SIGTERM during the first of three measured runs: every rank stops after that run, not after the
    configuration's other repeats; rank 0's row has the one run."""
    import signal

    runs = []

    def measure(stops):
        runs.append(1)
        stops.append(signal.SIGTERM)
        return {"step_ms": 10.0, "blas_threads": [1, 1]}

    rows, _ = in_job_on_two_ranks(monkeypatch, tmp_path, lambda stops: 0.01, measure, repeat=3)
    assert len(runs) == 2  # one run on each rank
    assert [(r["scheme"], r["repeats"], r["measured_ms"]) for r in rows] == [("data", 1, 10.0)]


def corunners_of(pid: int) -> list[int]:
    """The kernel co-runners (python -m singa_mpi.cost.corunners) among the descendants of ``pid``."""
    parents = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile

    def descends(child: int) -> bool:
        while child in parents and child > 1:
            child = parents[child]
            if child == pid:
                return True
        return False

    found = []
    for child in parents:
        try:
            if descends(child) and b"singa_mpi.cost.corunners" in pathlib.Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_in_job_cut_short_while_predicting_stops_at_once(tmp_path):
    """SIGTERM while rank 0 predicts (timing kernels beside a co-runner, which the signal ends too): every
    rank stops, rank 0 reports no rows and writes an empty --json; exit 143.  The prediction failing on
    the ended co-runner used to end rank 0 with a traceback and leave rank 1 waiting for it for ever."""
    import signal
    import time

    sys.path.insert(0, str(ROOT / "scripts"))
    from benchkit import bench_env, mpiexec_command

    out = tmp_path / "rows.json"
    cmd = mpiexec_command(2) + [sys.executable, str(ROOT / "scripts" / "bench_cost.py"), "--in-job", "--nets",
                                "mnist_mlp", "cifar10_convnet", "--repeat", "1", "--steps", "2", "--json", str(out)]
    job = subprocess.Popen(cmd, env=dict(bench_env(), XDG_CACHE_HOME=str(tmp_path)), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        for line in job.stdout:
            if "communicator rates:" in line:  # printed as the predictions start
                break
        while not corunners_of(job.pid):  # rank 0 times its first kernel beside a co-runner
            assert job.poll() is None, job.stdout.read()
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)
        rest, _ = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, rest
    assert "cut short (SIGTERM): the rows done so far" in rest and "Traceback" not in rest, rest
    assert json.loads(out.read_text()) == []


@pytest.mark.slow
def test_in_job_a_rank_that_fails_ends_every_rank(tmp_path):
    """Rank 0 fails (saving its kernel timings raises: a fault injected into rank 0 alone): its error is
    printed and every rank ends, exit 1.  The other rank used to wait for it in the next collective for
    ever.  (The fault was an XDG_CACHE_HOME that is a file, until a cache that cannot be written became a
    warning.)"""
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchkit import bench_env, mpiexec_command

    script = str(ROOT / "scripts" / "bench_cost.py")
    faulty = ("import runpy, sys; from singa_mpi.cost import kernels\n"
              "def save(self): raise NotADirectoryError(20, 'Not a directory', 'injected')\n"
              "kernels.KernelTimes.save = save; sys.argv = sys.argv[1:]\n"
              "runpy.run_path(sys.argv[0], run_name='__main__')")
    # rank 0 runs the script with the fault, the others as it is
    rank_zero = ('[ "${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-}}" = 0 ] && exec "$1" -c "$2" "${@:3}"; '
                 'exec "$1" "${@:3}"')
    cmd = mpiexec_command(2) + ["bash", "-c", rank_zero, "bash", sys.executable, faulty, script, "--in-job", "--nets",
                                "mnist_mlp", "--schemes", "data", "--repeat", "1", "--steps", "2", "--json",
                                str(tmp_path / "rows.json")]
    out = subprocess.run(cmd, env=dict(bench_env(), XDG_CACHE_HOME=str(tmp_path / "cache")), capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "NotADirectoryError" in out.stderr and "bench_cost: rank 0 failed (above): ending every rank" in out.stderr
    assert json.loads((tmp_path / "rows.json").read_text()) == []  # rank 0 reported the rows done: none
