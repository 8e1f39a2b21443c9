"""Smoke tests of scripts/bench_gru.py: a tiny run on 1 and 2 ranks prints the table and the ratio lines;
without PyTorch the script skips with one line and exit status 0."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_gru.py"


def test_bench_gru_prints_table_and_ratios(tmp_path):
    pytest.importorskip("torch")
    cmd = [sys.executable, str(SCRIPT), "--hidden", "16", "--batch", "4", "--unroll", "5", "--steps", "3",
           "--warmup", "2", "--repeat", "1", "--ranks", "1", "2", "--max-bytes", "20000",
           "--keep", str(tmp_path / "work")]
    out = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"^GRU char-rnn training step: batch 4, unroll 5, hidden 16, vocab \d+,", text, re.MULTILINE), text
    assert re.search(r"^model\s+ranks\s+ms/step\s+fastest\s+warm-up ms/step\s+loss$", text, re.MULTILINE), text
    for model, ranks in (("singa_mpi", 1), ("singa_mpi", 2), ("pytorch", 1)):
        assert re.search(rf"^{model}\s+{ranks}(\s+\d+\.\d){{3}}\s+\d+\.\d{{3}}$", text, re.MULTILINE), text
    assert re.search(r"^step time ratio singa_mpi 1 rank / PyTorch 1 thread: \d+\.\d\dx "
                     r"\(goal <= 1\.3x: goal (met|missed); fastest rounds: \d+\.\d\dx\)$", text, re.MULTILINE), text
    assert re.search(r"^speed-up singa_mpi 2 ranks over 1 rank: \d+\.\d\dx "
                     r"\(goal >= 1\.6x: goal (met|missed); fastest rounds: \d+\.\d\dx\)$", text, re.MULTILINE), text
    assert re.search(r"^note: PyTorch's GRU gates", text, re.MULTILINE), text
    # both sides learn the same text: after 5 steps the mean loss per character is near log(vocab)
    losses = [float(line.split()[-1]) for line in text.splitlines() if re.match(r"(singa_mpi|pytorch)\s", line)]
    assert all(2.0 < loss < 6.0 for loss in losses), text


def test_bench_gru_skips_without_torch(tmp_path):
    """torch hidden (sys.modules['torch'] = None makes find_spec report it missing): one line, exit 0."""
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = [{str(SCRIPT)!r}]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines() == [out.stdout.strip()] and "skipped" in out.stdout, out.stdout
