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
