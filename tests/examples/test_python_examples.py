"""The Python examples (examples/python/): each builds its conf/ job field for field, trains under
mpiexec -n 2 to the numbers of its serial run (random arrays of the data's shapes), and the API and
the examples pass the type checker (mypy, configured in pyproject.toml)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from mpi_jobs import mpi_env, mpiexec_command
from singa_mpi.config.load import load_job

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "python"
MATCHING = {("mnist_mlp.py", None): "mnist_mlp.conf", ("cifar10_cnn.py", None): "cifar10_convnet.conf",
            ("mnist_ae.py", None): "rbm_mnist_autoencoder.conf", ("char_rnn.py", None): "char_rnn.conf",
            **{("mnist_rbm.py", stage): f"rbm_mnist_{stage}.conf" for stage in (1, 2, 3, 4)}}


def _module(script: str, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # mnist_ae.py imports mnist_rbm.py, as run from there
    spec = importlib.util.spec_from_file_location(script[:-3], EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script,stage,conf", [(script, stage, conf) for (script, stage), conf in MATCHING.items()])
def test_an_example_builds_its_conf_job_field_for_field(script, stage, conf, monkeypatch):
    module = _module(script, monkeypatch)
    job = module.build() if stage is None else module.build(stage)
    assert job.to_proto() == load_job(ROOT / "conf" / conf).proto


def _losses(folder: pathlib.Path, script: str, ranks: int, arguments: list[str], workspace: str) -> list[float]:
    """The train phase's loss (or squared error: the RBMs) per report of a run of ``script`` in its own
    ``folder`` (the RBM examples write where their jobs say, below the current folder)."""
    folder.mkdir()
    if script == "char_rnn.py":  # its text: Python's own source (singa-mpi data text), in each run's folder
        made = subprocess.run([sys.executable, "-m", "singa_mpi", "data", "text", "--out", "data/text"], cwd=folder,
                              env=mpi_env(), capture_output=True, text=True, timeout=300)
        assert made.returncode == 0, made.stderr[-2000:]
    prefix = mpiexec_command(ranks) if ranks > 1 else []
    done = subprocess.run(prefix + [sys.executable, str(EXAMPLES / script)] + arguments, cwd=folder, env=mpi_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (folder / workspace / "metrics.jsonl").read_text().splitlines()]
    return [r.get("loss", r.get("squared_error")) for r in records if r["phase"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize("script,arguments,workspace", [
    ("mnist_mlp.py", ["--synthetic", "320", "--steps", "12", "--workspace", "ws"], "ws"),
    ("cifar10_cnn.py", ["--synthetic", "200", "--steps", "4", "--workspace", "ws"], "ws"),
    ("mnist_rbm.py", ["--stage", "1", "--synthetic", "300", "--steps", "6"], "workspace/rbm_mnist_1"),
    ("char_rnn.py", ["--steps", "3", "--workspace", "ws"], "ws"),
])
def test_an_example_trains_the_serial_numbers_on_two_ranks(tmp_path, script, arguments, workspace):
    serial = _losses(tmp_path / "one", script, 1, arguments, workspace)
    assert len(serial) >= 1 and None not in serial
    assert _losses(tmp_path / "two", script, 2, arguments, workspace) == pytest.approx(serial, rel=1e-5)


def test_the_api_and_the_examples_pass_the_type_checker():
    mypy = shutil.which("mypy", path=str(pathlib.Path(sys.executable).parent))
    if mypy is None:
        pytest.fail("mypy not found: pip install -e '.[test]' installs it")
    done = subprocess.run([mypy, "--no-incremental"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize("script", ["mnist_mlp.py", "cifar10_cnn.py", "mnist_rbm.py", "mnist_ae.py"])
@pytest.mark.parametrize("rows", ["0", "-3", "4", "many"])
def test_an_example_refuses_a_number_of_synthetic_rows_it_cannot_use(script, rows, monkeypatch, capsys):
    """--synthetic 0 trained on data/mnist/ (a missing file's error), -3 ended in numpy's "negative
    dimensions are not allowed", 4 in "argument x of shape (0, 784)" (a fifth as many test rows: none)."""
    module = _module(script, monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        module.main(["--synthetic", rows])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: argument --synthetic: {rows!r}: expected a number of rows >= 5 (a fifth as many more are the "
        f"test's)")


@pytest.mark.parametrize("script", sorted({script for script, _ in MATCHING}))
def test_an_example_s_help_describes_it_in_whole_sentences(script, monkeypatch, capsys):
    """-h gave the docstring's first line alone, which stops mid-sentence ("... with a staircase learning
    rate:"); it gives the first paragraph, whole."""
    module = _module(script, monkeypatch)
    with pytest.raises(SystemExit) as done:
        module.main(["-h"])
    assert done.value.code == 0
    first = " ".join(module.__doc__.split("\n\n")[0].split())
    assert first.endswith(".") and first in " ".join(capsys.readouterr().out.split())
