"""A job's checkpoint_path that is not there yet (SINGA's stacked RBMs: conf/rbm_mnist_2.conf before
rbm_mnist_1 ran): `check` warns in one line and passes (exit 0, as for missing data), naming the job that
writes it when one of the job files beside the job trains into that workspace, else what file was expected.
:func:`singa_mpi.checks.checkpoint_paths.missing_checkpoint_paths` gives the same line to `train`."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.config.load import load_job

REPO = pathlib.Path(__file__).resolve().parents[2]
CHAIN = sorted((REPO / "conf").glob("rbm_mnist_*.conf"))


@pytest.fixture
def chain(tmp_path, monkeypatch) -> pathlib.Path:
    """The RBM chain's job files in tmp_path/conf, run from tmp_path (as from a checkout)."""
    (tmp_path / "conf").mkdir()
    for path in CHAIN:
        shutil.copy(path, tmp_path / "conf" / path.name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def check(*argv: str, cwd) -> tuple[int, list[str], str]:
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "check", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warning: ") and "checkpoint_path" in line]
    return done.returncode, warnings, done.stderr


def test_check_names_the_job_that_writes_a_missing_checkpoint_path(chain):
    code, warnings, err = check("conf/rbm_mnist_2.conf", cwd=chain)
    assert code == 0, err
    assert warnings == ["warning: conf/rbm_mnist_2.conf:17:1: checkpoint_path 'workspace/rbm_mnist_1' not found: run "
                        "conf/rbm_mnist_1.conf first (workspace/rbm_mnist_1 is its workspace)"]


def test_each_missing_entry_is_a_line(chain):
    code, warnings, err = check("conf/rbm_mnist_4.conf", cwd=chain)
    assert code == 0, err
    assert [w.split(": run ")[1] for w in warnings] == [
        f"conf/rbm_mnist_{k}.conf first (workspace/rbm_mnist_{k} is its workspace)" for k in (3, 2, 1)]


def test_no_warning_once_the_job_before_wrote_a_checkpoint(chain):
    checkpoint.write(checkpoint.checkpoint_path("workspace/rbm_mnist_1", 6000),
                     checkpoint.Checkpoint(step=6000, params={"w": np.ones((2, 2), np.float32)}))
    code, warnings, err = check("conf/rbm_mnist_2.conf", cwd=chain)
    assert code == 0 and warnings == [], (warnings, err)


def test_a_workspace_without_checkpoints_is_missing_too(chain):
    os.makedirs("workspace/rbm_mnist_1/checkpoint")
    _, warnings, _ = check("conf/rbm_mnist_2.conf", cwd=chain)
    assert warnings == ["warning: conf/rbm_mnist_2.conf:17:1: checkpoint_path 'workspace/rbm_mnist_1': no checkpoint "
                        "in workspace/rbm_mnist_1/checkpoint yet: run conf/rbm_mnist_1.conf first "
                        "(workspace/rbm_mnist_1 is its workspace)"]


@pytest.mark.parametrize("entry", ["workspace/rbm_mnist_1/checkpoint/step6000.h5",
                                   "workspace/rbm_mnist_1/checkpoint/step6000-worker0",  # SINGA 0.x's names
                                   "workspace/rbm_mnist_1/checkpoint", "./workspace/rbm_mnist_1/"])
def test_a_checkpoint_file_or_folder_of_that_workspace(chain, entry):
    job = chain / "conf" / "rbm_mnist_2.conf"
    job.write_text(job.read_text().replace('checkpoint_path: "workspace/rbm_mnist_1"', f'checkpoint_path: "{entry}"'))
    _, warnings, _ = check("conf/rbm_mnist_2.conf", cwd=chain)
    assert len(warnings) == 1 and f"checkpoint_path '{entry}'" in warnings[0], warnings
    assert warnings[0].endswith("run conf/rbm_mnist_1.conf first (workspace/rbm_mnist_1 is its workspace)"), warnings


def test_a_job_without_cluster_workspace_writes_workspace_slash_its_name(chain):
    first = chain / "conf" / "rbm_mnist_1.conf"
    first.write_text(first.read_text().replace('cluster { workspace: "workspace/rbm_mnist_1" }', ""))
    _, warnings, _ = check("conf/rbm_mnist_2.conf", cwd=chain)  # the default workspace: workspace/<name>
    assert len(warnings) == 1 and warnings[0].endswith("run conf/rbm_mnist_1.conf first (workspace/rbm_mnist_1 "
                                                       "is its workspace)"), warnings


def test_without_a_job_that_writes_it_the_line_says_what_was_expected(chain):
    (chain / "conf" / "rbm_mnist_1.conf").unlink()
    _, warnings, _ = check("conf/rbm_mnist_2.conf", cwd=chain)
    assert warnings == ["warning: conf/rbm_mnist_2.conf:17:1: checkpoint_path 'workspace/rbm_mnist_1' not found: "
                        "expected workspace/rbm_mnist_1/checkpoint/step<N>.h5, written by the job whose "
                        "cluster.workspace is workspace/rbm_mnist_1 (no job file in conf/ trains there)"]


def test_a_missing_file_named_directly(chain):
    job = chain / "conf" / "rbm_mnist_2.conf"
    job.write_text(job.read_text().replace('checkpoint_path: "workspace/rbm_mnist_1"',
                                           'checkpoint_path: "elsewhere/params.h5"'))
    _, warnings, _ = check("conf/rbm_mnist_2.conf", cwd=chain)
    assert warnings == ["warning: conf/rbm_mnist_2.conf:17:1: checkpoint_path 'elsewhere/params.h5' not found: "
                        "expected a checkpoint file there (no job file in conf/ trains into elsewhere)"]


def test_train_gets_the_same_line(chain):
    from singa_mpi.checks.checkpoint_paths import missing_checkpoint_paths

    cfg = load_job("conf/rbm_mnist_3.conf")
    assert missing_checkpoint_paths(cfg) == [
        f"conf/rbm_mnist_3.conf:{line}:1: checkpoint_path 'workspace/rbm_mnist_{k}' not found: run "
        f"conf/rbm_mnist_{k}.conf first (workspace/rbm_mnist_{k} is its workspace)" for line, k in ((17, 2), (18, 1))]


def test_train_refuses_with_the_line_that_names_the_job(tmp_path):
    """The training error says which job to run first, as check's warning does (digits: no data to fetch)."""
    (tmp_path / "conf").mkdir()
    for path in sorted((REPO / "conf").glob("rbm_digits_*.conf")):
        shutil.copy(path, tmp_path / "conf" / path.name)
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "train", "conf/rbm_digits_2.conf", "--steps", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [
        "singa-mpi: error: conf/rbm_digits_2.conf:16:1: checkpoint_path 'workspace/rbm_digits_1' not found: run "
        "conf/rbm_digits_1.conf first (workspace/rbm_digits_1 is its workspace)"], done.stderr
