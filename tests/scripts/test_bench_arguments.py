"""The benchmark scripts refuse counts that would run nothing or divide by zero (ranks, steps, repeats
of 0 or less) in one line, before any run starts: benchkit.positive_int, and bench.sbatch's STEPS."""
import argparse
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import positive_int  # noqa: E402


@pytest.mark.parametrize("text", ["0", "-2", "x", "1.5", ""])
def test_positive_int_refuses_what_is_no_count(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number of at least 1"):
        positive_int(text)


def test_positive_int_takes_a_count():
    assert positive_int("3") == 3 and positive_int("+2") == 2


@pytest.mark.parametrize("script, args", [("bench_scaling.py", ["--steps", "0"]), ("bench_scaling.py", ["--ranks", "1", "-2"]),
                                          ("bench_scaling.py", ["--repeat", "0"]), ("bench_serial.py", ["--steps", "0"]),
                                          ("bench_peer.py", ["--ranks", "0"]), ("bench_cost.py", ["--steps", "0"])])
def test_the_scripts_refuse_a_zero_count_in_one_line(script, args):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines()[-1].endswith(": expected a whole number of at least 1"), out.stderr
    assert "Traceback" not in out.stderr


def test_bench_sbatch_refuses_steps_that_are_no_count(tmp_path):
    env = dict(os.environ, STEPS="0", RESULTS=str(tmp_path))
    out = subprocess.run(["bash", str(ROOT / "slurm" / "bench.sbatch")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == "bench.sbatch: STEPS=0: expected a whole number of timed steps, at least 1"
    assert not list(tmp_path.iterdir())
