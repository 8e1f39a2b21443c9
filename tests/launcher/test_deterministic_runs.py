"""`train --deterministic` from the command line: the example jobs on several ranks end with the bits
of the run on one, checkpoints compared array by array (params and the updater's state)."""
import pathlib
import subprocess
import sys

import h5py
import numpy as np
import pytest

from mpi_jobs import mpi_env, mpiexec_command

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _train(n: int, conf: str, workspace: pathlib.Path, cwd: pathlib.Path) -> None:
    prefix = mpiexec_command(n) if n > 1 else []
    command = prefix + [sys.executable, "-m", "singa_mpi", "train", str(ROOT / "conf" / conf), "--deterministic",
                        "--steps", "30", "--workspace", str(workspace)]
    done = subprocess.run(command, cwd=cwd, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def _arrays(workspace: pathlib.Path) -> dict[str, bytes]:
    path = max((workspace / "checkpoint").glob("step*.h5"), key=lambda p: int(p.stem[4:]))  # the last step's
    found = {}
    with h5py.File(path) as f:
        def keep(name, item):
            if isinstance(item, h5py.Dataset) and name.startswith(("params/", "updater/")) and item.dtype.kind == "f":
                found[name] = np.ascontiguousarray(item[()]).tobytes()
        f.visititems(keep)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("conf,ranks", [("digits_sandblaster.conf", 5), ("digits_mlp.conf", 3), ("rbm_digits_1.conf", 2)])
def test_an_example_job_on_several_ranks_ends_with_the_bits_of_one(tmp_path, conf, ranks):
    """digits_sandblaster: 3 workers beside 2 servers whose ranges cut the params; digits_mlp: AllReduce
    on 3 workers, the batch of 64 in 4 blocks of 16 (32, 16 and 16 rows); rbm_digits_1: CD-1, the
    batch of 100 in the default blocks of 25, which one rank must cut too (not the field's 16)."""
    _train(1, conf, tmp_path / "one", tmp_path)  # (prepares the digits data below tmp_path first)
    _train(ranks, conf, tmp_path / "many", tmp_path)
    one, many = _arrays(tmp_path / "one"), _arrays(tmp_path / "many")
    assert any(name.startswith("updater/") for name in one)  # momentum: the state is compared too
    assert sorted(one) == sorted(many)
    assert [name for name in one if one[name] != many[name]] == []
