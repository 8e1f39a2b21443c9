"""`singa-mpi draw`: an RBM's filters and its mean-field reconstructions (and an autoencoder's) from a
checkpoint into PNG files of the size the tile grid implies; one-line errors for what it cannot draw."""
import pathlib
import sys

import h5py
import numpy as np
import pytest

import nets
from singa_mpi import cli, pictures
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.config.load import load_job
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.launcher import RunOptions, run_training

STEPS = 5
HDIM = 12  # 12 filters: a 4-column, 3-row grid of 4x4 tiles


def train(folder, text: str) -> tuple[str, str, str]:
    """Train the job ``text`` in ``folder``/ws; returns (job path, workspace, final checkpoint)."""
    conf, ws = folder / "job.conf", str(folder / "ws")
    conf.write_text(text)
    assert run_training(str(conf), lambda cfg: ws, RunOptions()) == 0
    return str(conf), ws, checkpoint.checkpoint_path(ws, STEPS)


def data_16(folder) -> str:
    return nets.make_data(str(folder / "data.h5"), 64, (16,), 5, unit=True)


@pytest.fixture(scope="module")
def rbm(tmp_path_factory):
    """An RBM on 16 visible units (4x4 images), trained for a few steps."""
    folder = tmp_path_factory.mktemp("rbm")
    # nets.rbm reads 12 features; these data have 16, so that a unit's filter is a 4x4 image
    text = nets.rbm(data_16(folder), 8, hdim=HDIM, lower=False, steps=STEPS).replace("shape: 12", "shape: 16")
    return train(folder, text)


@pytest.fixture(scope="module")
def autoencoder(tmp_path_factory):
    """16 -> 8 (weight stored transposed, (16, 8)) -> 16, trained on the squared error against its input."""
    folder = tmp_path_factory.mktemp("ae")
    layers = [nets._data_layer(data_16(folder), 8, (16,)), nets._ip("enc", "data", 8, transpose=True),
              nets._act("sig1", "enc", "kSigmoid"), nets._ip("dec", "sig1", 16), nets._act("sig2", "dec", "kSigmoid"),
              'layer { name: "loss" type: kEuclideanLoss srclayers: "sig2" srclayers: "data" }']
    return train(folder, nets.job_text(layers, STEPS, name="ae"))


def logistic(x):
    return 1 / (1 + np.exp(-x))


def image_size(path) -> tuple[int, int]:
    """(width, height) in pixels of a PNG."""
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(str(path)).shape
    return width, height


def expected_size(cols: int, rows: int) -> tuple[int, int]:
    """Square tiles: TILE inches a column and a row, the title on top, at DPI."""
    width = max(cols * pictures.TILE, pictures.MIN_WIDTH)
    return round(pictures.DPI * width), round(pictures.DPI * (rows * pictures.TILE + pictures.TITLE))


# ------------------------------------------------------------------ maths, no matplotlib

def test_rbm_reconstructions_are_the_mean_field_of_the_checkpoint(rbm):
    job, ws, path = rbm
    ckpt = checkpoint.read(path)
    inputs, outputs = pictures.reconstructions(load_job(job), ckpt, ws, "test", n=5)
    assert inputs.shape == outputs.shape == (5, 16)
    with h5py.File(pathlib.Path(job).with_name("data.h5")) as f:
        data = f["data"][...]
    assert all(np.any(np.all(np.isclose(data, row), axis=1)) for row in inputs)  # rows of the data set
    p = {name: value.astype(np.float64) for name, value in ckpt.params.items()}
    hidden = logistic(inputs @ p["w_rbm"].T + p["b_hid"])
    np.testing.assert_allclose(outputs, logistic(hidden @ p["w_rbm"] + p["b_vis"]), rtol=0, atol=1e-5)


def test_autoencoder_reconstructions_are_its_predictions(autoencoder):
    job, ws, path = autoencoder
    ckpt = checkpoint.read(path)
    inputs, outputs = pictures.reconstructions(load_job(job), ckpt, ws, "test", n=20)
    assert inputs.shape == outputs.shape == (8, 16)  # no more rows than one batch
    p = {name: value.astype(np.float64) for name, value in ckpt.params.items()}
    code = logistic(inputs @ p["w_enc"] + p["b_enc"])  # transposed: (in, out)
    np.testing.assert_allclose(outputs, logistic(code @ p["w_dec"].T + p["b_dec"]), rtol=0, atol=1e-5)


def test_a_job_that_is_neither_rbm_nor_autoencoder_is_refused(tmp_path):
    conf = tmp_path / "mlp.conf"
    conf.write_text(nets.mlp(str(tmp_path / "none.h5"), 8, "data"))
    with pytest.raises(ConfigError, match=r"mlp.conf: test phase: neither an RBM .* nor an autoencoder"):
        pictures.job_kind(load_job(str(conf)), "test")


def test_a_checkpoint_of_another_net_is_refused(rbm, tmp_path):
    job, ws, _ = rbm
    other = checkpoint.Checkpoint(step=1, params={"w_rbm": np.zeros((3, 16), np.float32)}, path="other.h5")
    with pytest.raises(DataError, match=r"other.h5: parameter 'w_rbm' has shape \(3, 16\): expected "
                                                 r"shape \(12, 16\)"):
        pictures.reconstructions(load_job(job), other, ws)


def test_tile_shapes():
    assert pictures.tile_shape(64, None) == (8, 8)
    assert pictures.tile_shape(784, None) == (28, 28)
    assert pictures.tile_shape(10, "2x5") == (2, 5)
    with pytest.raises(ConfigError, match=r"^10 values per image is no square: expected --shape HxW"):
        pictures.tile_shape(10, None)
    with pytest.raises(ConfigError, match=r"--shape 3x3: 9 pixels: expected 10"):
        pictures.tile_shape(10, "3x3")
    assert pictures.normalise(np.array([2.0, 4.0, 3.0])).tolist() == [0.0, 1.0, 0.5]


# ------------------------------------------------------------------ PNG files

def test_filters_grid_next_to_the_checkpoint(rbm, capsys):
    pytest.importorskip("matplotlib")
    _, _, path = rbm
    assert cli.main(["draw", "filters", path]) == 0
    out = path.replace(f"step{STEPS}.h5", f"step{STEPS}_w_rbm_filters.png")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("drawing w_rbm (12, 16), the checkpoint's first 2-D parameter")
    assert lines[1] == f"wrote {out}"
    assert image_size(out) == expected_size(4, 3)


def test_at_most_max_filters(rbm, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "five.png"
    assert cli.main(["draw", "filters", rbm[2], "--param", "w_rbm", "--max", "5", "-o", str(out)]) == 0
    assert image_size(out) == expected_size(3, 2)


def test_transposed_weight_is_drawn_by_columns(autoencoder, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "enc.png"  # w_enc (16, 8): 8 units of 16 inputs, not 16 of 8
    assert cli.main(["draw", "filters", autoencoder[2], "--param", "w_enc", "-o", str(out)]) == 0
    assert image_size(out) == expected_size(3, 3)


def test_reconstructions_two_rows_of_n(rbm, capsys):
    pytest.importorskip("matplotlib")
    job, ws, path = rbm
    assert cli.main(["draw", "reconstructions", job, path, "-n", "6", "--workspace", ws]) == 0
    out = path.replace(".h5", "_reconstructions.png")
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}"
    assert image_size(out) == expected_size(6, 2)


def test_more_reconstructions_than_the_batch_holds_are_named_in_a_note(rbm, capsys):
    """-n above the batch drew the batch's rows without a word."""
    pytest.importorskip("matplotlib")
    job, ws, path = rbm
    assert cli.main(["draw", "reconstructions", job, path, "-n", "100", "--workspace", ws]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "note: -n 100: the test batch holds 8 rows: drawing 8" in out, out
    assert image_size(path.replace(".h5", "_reconstructions.png")) == expected_size(8, 2)


def one_line_error(capsys, argv, code: int) -> str:
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("singa-mpi: error: "), err
    return err


def test_one_line_errors(rbm, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = rbm[2]
    bad = tmp_path / "odd.h5"
    checkpoint.write(str(bad), checkpoint.Checkpoint(step=0, params={"w": np.ones((3, 10), np.float32)}))
    assert "10 values per image is no square: expected --shape HxW" in one_line_error(
        capsys, ["draw", "filters", str(bad)], 2)
    assert cli.main(["draw", "filters", str(bad), "--shape", "2x5", "-o", str(tmp_path / "odd.png")]) == 0
    assert "no such file" in one_line_error(capsys, ["draw", "filters", str(tmp_path / "none.h5")], 3)
    assert "parameter 'b_vis' has shape (16,): expected a 2-D weight, one of w_rbm" in one_line_error(
        capsys, ["draw", "filters", path, "--param", "b_vis"], 3)
    mlp = tmp_path / "mlp.conf"
    mlp.write_text(nets.mlp(str(tmp_path / "none.h5"), 8, "data"))
    assert "neither an RBM" in one_line_error(capsys, ["draw", "reconstructions", str(mlp), path], 2)


def test_without_matplotlib_one_line_says_how_to_install_it(rbm, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    err = one_line_error(capsys, ["draw", "filters", rbm[2]], 2)  # as tests/cli/test_cli_optional.py
    assert "singa-mpi draw needs matplotlib" in err and "pip install 'singa_mpi[plot]'" in err


def test_a_phase_the_job_reads_no_data_in_is_named_with_the_phases_it_has(rbm, tmp_path, capsys):
    """`--phase val` on a job whose data layer is kept for train and test only blamed the RBM layer
    whose input was left out of the phase."""
    job, _, path = rbm
    conf = tmp_path / "rbm.conf"
    conf.write_text(pathlib.Path(job).read_text().replace('type: kRecordInput', 'type: kRecordInput include: kTrain '
                                                          'include: kTest', 1))
    err = one_line_error(capsys, ["draw", "reconstructions", str(conf), path, "--phase", "val"], 2)
    assert (f"--phase val: {conf} reads no data in its val phase (no input layer is kept for it): expected a phase "
            f"it reads data in: train, test") in err, err
