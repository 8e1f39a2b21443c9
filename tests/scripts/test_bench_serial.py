"""scripts/bench_serial.py removes its temporary folders (synthetic data, workspaces: ~18 MB a run) at
the end, also when a step fails."""
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_serial  # noqa: E402


def test_a_run_leaves_no_temporary_folder(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_serial.py"), "--steps", "1"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "mnist_mlp" in out.stdout
    assert list(scratch.iterdir()) == []


def test_a_failed_step_leaves_no_temporary_folder(tmp_path, monkeypatch):
    def failing(step, steps, warmup=3):
        raise RuntimeError("a step failed")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(bench_serial, "time_steps", failing)
    monkeypatch.setattr(sys, "argv", ["bench_serial.py", "--steps", "1"])
    with pytest.raises(RuntimeError, match="a step failed"):
        bench_serial.main()
    assert list(tmp_path.iterdir()) == []
