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
