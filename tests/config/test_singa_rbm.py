"""SINGA 0.3's own RBM chain files (tests/config/singa03_rbm, unchanged) pass check and plan.

SINGA itself aborted on them (its renaming of every param to ``0#...`` broke their
``share_from: "w1"``, bug B1 of the facts reference); here they check, plan and name the
params as the files do.  Their data and the checkpoints of earlier stages need not exist.
"""
import pathlib
import warnings

import pytest

from singa_mpi import cli
from singa_mpi.checks.job import validate
from singa_mpi.config.load import load_job
from singa_mpi.planner import partition

FILES = pathlib.Path(__file__).parent / "singa03_rbm"
SIZES = [784, 1000, 500, 250, 30]
# file -> (algorithm, layers per phase, params the job owns)
EXPECTED = {
    "rbm1.conf": ("kCD", 3, ["b11", "b12", "w1"]),
    "rbm2.conf": ("kCD", 5, ["b12", "b21", "b22", "w1", "w2"]),
    "rbm3.conf": ("kCD", 7, ["b12", "b22", "b31", "b32", "w1", "w2", "w3"]),
    "rbm4.conf": ("kCD", 9, ["b12", "b22", "b32", "b41", "b42", "w1", "w2", "w3", "w4"]),
    # the decoder's weights share the encoder's (w5..w8 are not owned); its biases are the RBMs' visible ones
    "autoencoder.conf": ("kBP", 17, ["w1", "w2", "w3", "w4", "b11", "b12", "b21", "b22", "b31", "b32", "b41", "b42"]),
}


def check(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return validate(load_job(FILES / name))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_singa_rbm_file_passes_check_unchanged(name):
    algorithm, layers, params = EXPECTED[name]
    summary = check(name)
    assert summary.algorithm == algorithm
    assert {p.phase: len(p.layers) for p in summary.phases} == {"train": layers, "test": layers}
    assert sorted(p for p, _ in summary.params) == sorted(params)
    k = int(name[3]) if name.startswith("rbm") else None
    if k is not None:  # the RBM's W: (hdim, visible units)
        assert dict(summary.params)[f"w{k}"] == (SIZES[k], SIZES[k - 1])
        assert summary.warnings  # its data files are not here: a warning each, no error


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_singa_rbm_file_plans_on_1_to_4_workers(name, n, capsys):
    assert cli.main(["plan", str(FILES / name), "-n", str(n)]) == 0
    assert f"rank {n - 1}:" in capsys.readouterr().out


def test_rbm4_hidden_units_are_gaussian_and_lower_layers_frozen():
    cfg = load_job(FILES / "rbm4.conf")
    hid = next(layer for layer in cfg.proto.neuralnet.layer if layer.name == "RBMHid")
    assert hid.rbm_conf.gaussian
    plan = partition(cfg, 2)
    synced = {sync.name for sync in plan.param_syncs}
    assert synced == {"w4", "b41", "b42"}  # data parallel: only the RBM's params are summed
