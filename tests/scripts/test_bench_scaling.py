"""Smoke test of scripts/bench_scaling.py: each run printed with its numbers as it is made, the table so far."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_each_run_and_the_table_so_far_are_printed_before_the_end(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_scaling.py"), "--ranks", "1", "--repeat", "1", "--steps", "2",
           "--nets", "mnist_mlp", "--schemes", "data", "feature", "--json", str(tmp_path / "runs.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    run = re.compile(r"  measured mnist_mlp (data|feature) n=1 \(1/1\): [\d,.]+ samples/s, [\d.]+ ms/step$")
    measured = [i for i, line in enumerate(lines) if run.match(line)]
    assert len(measured) == 2, out.stdout
    partial = lines.index("mnist_mlp data done; the table so far:")
    assert measured[0] < partial < measured[1], out.stdout
    assert re.match(r"mnist_mlp +data +n=1 ", lines[partial + 1]), out.stdout
    assert (tmp_path / "runs.json").exists()
