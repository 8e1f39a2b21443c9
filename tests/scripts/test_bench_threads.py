"""Smoke test of scripts/bench_threads.py: each run printed as it is made, the table so far, a cut-short run's table."""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICK = [sys.executable, str(ROOT / "scripts" / "bench_threads.py"), "--jobs", "digits_mlp", "--ranks", "1",
         "--settings", "gemm=1", "default"]
RUN_LINE = re.compile(r"^  digits_mlp n=1 (gemm=1|default): [\d.]+ ms/step \(\d+ steps, \d+s\) \[\d+/\d+\]$")


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                             "MKL_NUM_THREADS")}


@pytest.mark.slow
def test_each_run_is_printed_as_it_is_made_and_the_table_after_each_repeat():
    out = subprocess.run(QUICK + ["--repeat", "2"], env=env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    runs = [i for i, line in enumerate(lines) if RUN_LINE.match(line)]
    assert len(runs) == 4, out.stdout
    partial = lines.index("after 1 of 2 repeats:")
    assert runs[1] < partial < runs[2], out.stdout  # the table of the first repeat before the second's runs
    assert lines[partial + 1].startswith("ms/step, median of 1 runs"), out.stdout
    assert any(line.startswith("ms/step, fastest of 2 runs") for line in lines[runs[-1]:]), out.stdout


@pytest.mark.slow
def test_a_run_cut_short_by_sigterm_prints_the_table_of_the_runs_done():
    proc = subprocess.Popen(QUICK + ["--repeat", "50"], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    first = proc.stdout.readline()  # blocks until the first run is done
    assert RUN_LINE.match(first.rstrip("\n")), first
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "cut short (SIGTERM): the table of the runs done so far" in rest
    assert re.search(r"^digits_mlp\s+1\s+[\d.]+", rest, re.M), rest  # a row of the table


@pytest.mark.slow
def test_a_run_stops_timing_after_its_budget_on_every_rank():
    """Oversubscribed settings run 5-20x slower: their timed steps end after --budget seconds (at least 3)."""
    from mpi_jobs import mpi_env, mpiexec_command

    worker = [sys.executable, str(ROOT / "scripts" / "bench_threads.py"), "--worker", "--job", "digits_mlp",
              "--setting", "gemm=1", "--steps", "200"]
    for cmd, budget, expected in ((worker, "0", 3), (mpiexec_command(2) + worker, "0", 3), (worker, "600", 200)):
        out = subprocess.run(cmd + ["--budget", budget], env=mpi_env(), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.splitlines()[-1])["steps"] == expected, out.stdout
