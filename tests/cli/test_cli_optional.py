"""A command that needs an optional extra this installation lacks (plot and draw need matplotlib) is one
line saying how to install it, exit code 2: a command line this installation cannot run, as a --plugin
module that is not installed (it was exit 1, which the README keeps for bugs). The optional extras that
only add something (tqdm's bar, Graphviz's pictures) fall back without an error.

The commands run in a process where ``import matplotlib`` fails, as in an installation without it."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from singa_mpi import errors
from singa_mpi.checkpoints import hdf5 as checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]
WITHOUT_MATPLOTLIB = ("import runpy, sys; sys.modules['matplotlib'] = None; "  # import matplotlib... raises ImportError
                      "runpy.run_module('singa_mpi', run_name='__main__', alter_sys=True)")


def without_matplotlib(*argv: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def workspace(tmp_path) -> str:
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 0, "phase": "train", "loss": 1.0, "elapsed": 0.1}) + "\n")
    return str(folder)


@pytest.fixture
def a_checkpoint(tmp_path) -> str:
    path = str(tmp_path / "step3.h5")
    checkpoint.write(path, checkpoint.Checkpoint(step=3, params={"w": np.ones((4, 9), np.float32)}))
    return path


@pytest.mark.parametrize("command", ["plot", "plot --profile", "draw filters"])
def test_plot_and_draw_without_matplotlib_are_one_line_exit_2(tmp_path, workspace, a_checkpoint, command):
    argv = command.split() + [a_checkpoint if command.startswith("draw") else workspace]
    done = without_matplotlib(*argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    word = argv[0]
    assert done.stderr == (f"singa-mpi: error: singa-mpi {word} needs matplotlib, which is not installed: "
                           f"pip install 'singa_mpi[plot]' (or pip install matplotlib)\n")
    assert not list(tmp_path.glob("**/*.png"))


def test_a_missing_extra_is_a_command_line_error():
    assert errors.MissingDependency.exit_code == 2
