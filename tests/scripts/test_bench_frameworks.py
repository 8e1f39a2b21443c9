"""Smoke test of scripts/bench_frameworks.py: a short MLP run of every framework (serial, and AllReduce,
Sandblaster and Downpour under mpiexec on 2-3 ranks) prints the table header and one row each."""
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FRAMEWORK_RANKS = {"serial": 1, "allreduce": 2, "sandblaster": 3, "downpour": 3}


@pytest.mark.slow
def test_bench_frameworks_prints_one_row_per_framework(tmp_path):
    # a low target: 20 steps reach about 0.7 test accuracy, so every row has a time
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_frameworks.py"), "--nets", "mnist_mlp", "--steps", "20",
           "--repeat", "1", "--target", "0.2", "--keep", str(tmp_path / "work"), "--json", str(tmp_path / "rows.json")]
    out = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"^net\s+framework\s+ranks\s+samples/s\s+x serial\s+time-to-acc\s+final acc$",
                     text, re.MULTILINE), text
    for framework, ranks in FRAMEWORK_RANKS.items():
        assert re.search(rf"^mnist_mlp\s+{framework}\s+{ranks}\s+[\d,]+\s+\d+\.\d\d\s+(\d+\.\ds|not reached)"
                         rf"\s+[01]\.\d{{4}}$", text, re.MULTILINE), text
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["framework"] for r in rows] == list(FRAMEWORK_RANKS)
    assert all(r["final_accuracy"] > 0.2 for r in rows), rows  # every framework learned something


@pytest.mark.slow
def test_each_run_and_the_table_so_far_are_printed_before_the_end(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_frameworks.py"), "--nets", "mnist_mlp", "--frameworks",
           "serial", "--steps", "10", "--repeat", "2", "--target", "0.2"]
    out = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    ran = [i for i, line in enumerate(lines) if re.match(
        r"  ran mnist_mlp serial \([12]/2\): [\d,]+ samples/s, time to 0.20: (\d+\.\ds|not reached), "
        r"final accuracy [01]\.\d{4}$", line)]
    assert len(ran) == 2, out.stdout
    partial = lines.index("the table so far:")
    assert ran[0] < partial < ran[1], out.stdout
    assert re.match(r"^mnist_mlp\s+serial\s+1\s+[\d,]+", lines[partial + 2]), out.stdout
