"""SINGA's deep autoencoder chain (conf/rbm_*): RBMs 1-4 by CD, then the autoencoder by BP, run in
order by scripts/rbm_chain.py; each job starts from the checkpoints of the ones before it."""
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.data.synthetic import write_synthetic
from mpi_jobs import mpi_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "rbm_chain.py"


def run_chain(cwd, *args):
    result = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=mpi_env(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def final(workspace: pathlib.Path) -> checkpoint.Checkpoint:
    ckpt = checkpoint.newest_good(str(workspace))
    assert ckpt is not None, f"no checkpoint in {workspace}"
    return ckpt


def errors(out: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (rbm_\S+\.conf)\s+([0-9.]+)", out, re.M)}


@pytest.mark.slow
def test_digits_chain_loads_each_stage_into_the_next_and_reports_the_error(tmp_path):
    out = run_chain(tmp_path, "--steps", "8")
    found = errors(out)
    assert sorted(found) == sorted(f"rbm_digits_{s}.conf" for s in ("1", "2", "3", "4", "autoencoder"))
    assert all(np.isfinite(v) and v > 0 for v in found.values())
    assert f"deep autoencoder reconstruction error: {found['rbm_digits_autoencoder.conf']:.4f}" in out
    ws = tmp_path / "workspace"
    stages = [final(ws / f"rbm_digits_{k}") for k in range(1, 5)]
    for k in range(2, 5):  # the RBMs below stay frozen: their weights are the earlier jobs' results
        for j in range(1, k):
            np.testing.assert_array_equal(stages[k - 1].params[f"w{j}"], stages[j - 1].params[f"w{j}"])
            np.testing.assert_array_equal(stages[k - 1].params[f"b{j}2"], stages[j - 1].params[f"b{j}2"])


@pytest.mark.slow
def test_autoencoder_starts_from_the_rbms(tmp_path):
    """With zero fine-tuning steps the autoencoder's weights are the RBMs' (decoder tied to the encoder)."""
    run_chain(tmp_path, "--steps", "3")
    subprocess.run([sys.executable, "-m", "singa_mpi", "train", str(ROOT / "conf" / "rbm_digits_autoencoder.conf"),
                    "--steps", "0", "--overwrite", "--workspace", "ae0"], cwd=tmp_path, env=mpi_env(), check=True,
                   capture_output=True, timeout=300)
    ae = final(tmp_path / "ae0")
    for k in range(1, 5):
        rbm = final(tmp_path / "workspace" / f"rbm_digits_{k}")
        for name in (f"w{k}", f"b{k}1", f"b{k}2"):
            np.testing.assert_array_equal(ae.params[name], rbm.params[name])


@pytest.mark.parametrize("ranks", [2])
@pytest.mark.slow
def test_mnist_chain_runs_on_synthetic_data_on_ranks(tmp_path, monkeypatch, ranks):
    """SINGA's sizes (784-1000-500-250-30), a step of each job, every job on two ranks."""
    monkeypatch.chdir(tmp_path)  # the confs' relative store paths land here
    for stage in ("1", "2", "3", "4", "autoencoder"):
        write_synthetic(str(ROOT / "conf" / f"rbm_mnist_{stage}.conf"), count=64)
    out = run_chain(tmp_path, "--set", "mnist", "--steps", "1", "-n", str(ranks))
    assert len(errors(out)) == 5 and "deep autoencoder reconstruction error" in out
