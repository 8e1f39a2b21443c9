"""Smoke test of scripts/bench_rbm.py: one tiny serial run prints the table, the ratios and the note."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_rbm_prints_table_and_ratios(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_rbm.py"), "--epochs", "1", "--hidden", "8", "--batch", "50",
           "--ranks", "1", "--repeat", "1", "--keep", str(tmp_path / "work")]
    out = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"^model\s+ranks\s+recon\. error", text, re.MULTILINE), text
    assert re.search(r"^singa_mpi\s+1\s+\d+\.\d{4}\s+\d+\.\d{4}\s+[\d,]+", text, re.MULTILINE), text
    assert re.search(r"^scikit-learn\s+1\s+\d+\.\d{4}\s+-\s+[\d,]+", text, re.MULTILINE), text
    assert re.search(r"^samples/s ratio singa_mpi/scikit-learn at 1 rank\(s\): \d+\.\d+x .*goal (met|missed)",
                     text, re.MULTILINE), text
    assert re.search(r"^error ratio singa_mpi/scikit-learn at 1 rank\(s\): \d+\.\d+ .*goal (met|missed)",
                     text, re.MULTILINE), text
    assert "persistent CD" in text
