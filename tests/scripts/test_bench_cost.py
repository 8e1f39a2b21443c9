"""Smoke test of scripts/bench_cost.py: one configuration predicted and measured, ratio printed."""
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
