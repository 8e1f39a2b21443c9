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
MATCHING = {"mnist_mlp.py": "mnist_mlp.conf", "cifar10_cnn.py": "cifar10_convnet.conf"}


def _module(script: str):
    spec = importlib.util.spec_from_file_location(script[:-3], EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script,conf", sorted(MATCHING.items()))
def test_an_example_builds_its_conf_job_field_for_field(script, conf):
    assert _module(script).build().to_proto() == load_job(ROOT / "conf" / conf).proto


def _losses(tmp_path: pathlib.Path, script: str, ranks: int, rows: int, steps: int) -> list[float]:
    workspace = tmp_path / f"{script[:-3]}-{ranks}"
    prefix = mpiexec_command(ranks) if ranks > 1 else []
    done = subprocess.run(prefix + [sys.executable, str(EXAMPLES / script), "--synthetic", str(rows), "--steps",
                                    str(steps), "--workspace", str(workspace)],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (workspace / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["phase"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize("script,rows,steps", [("mnist_mlp.py", 320, 12), ("cifar10_cnn.py", 200, 4)])
def test_an_example_trains_the_serial_numbers_on_two_ranks(tmp_path, script, rows, steps):
    serial = _losses(tmp_path, script, 1, rows, steps)
    assert len(serial) >= 1
    assert _losses(tmp_path, script, 2, rows, steps) == pytest.approx(serial, rel=1e-5)


def test_the_api_and_the_examples_pass_the_type_checker():
    mypy = shutil.which("mypy", path=str(pathlib.Path(sys.executable).parent))
    if mypy is None:
        pytest.fail("mypy not found: pip install -e '.[test]' installs it")
    done = subprocess.run([mypy, "--no-incremental"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
