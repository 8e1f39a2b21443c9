"""Scripts run under mpiexec get the BLAS threads `singa-mpi train` chooses, without OMP_NUM_THREADS."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from singa_mpi import threads
from mpi_jobs import launcher, mpiexec_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))


def no_thread_variables(**extra: str) -> dict[str, str]:
    """The launcher's environment with none of OMP/OPENBLAS/MKL_NUM_THREADS: as a user types the README."""
    env = launcher().environ(PYTHONUNBUFFERED="1", **extra)
    return {k: v for k, v in env.items() if k not in threads.THREAD_VARIABLES}


def train_choice(net: str, ranks: int, tmp_path) -> int:
    """What `singa-mpi train` gives each of ``ranks`` ranks on this node for the example net."""
    from bench_scaling import NETS, partitioned
    from bench_serial import job_on_synthetic_data
    from singa_mpi.checks.job import validate

    conf, shape, _ = NETS[net]
    cfg = partitioned(job_on_synthetic_data(conf, str(tmp_path), shape, 16), "data")
    work = threads.work_per_step(cfg, validate(cfg), ranks)
    return threads.choose_threads(threads.cores_available(), ranks, {}, work)


def test_the_helper_chooses_as_train_for_the_ranks_on_this_node(tmp_path):
    code = ("import sys; sys.path.insert(0, 'scripts'); import benchkit; "
            "print(benchkit.blas_threads_as_train())")
    env = {k: v for k, v in os.environ.items() if k not in threads.THREAD_VARIABLES}
    for ranks in (1, 2):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(env, MPI_LOCALNRANKS=str(ranks)),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout) == threads.choose_threads(threads.cores_available(), ranks, {}), (ranks, out.stdout)


def test_profile_step_under_mpiexec_uses_trains_thread_choice(tmp_path):
    cmd = mpiexec_command(2) + [sys.executable, "scripts/profile_step.py", "--scheme", "feature", "--steps", "1"]
    out = subprocess.run(cmd, cwd=ROOT, env=no_thread_variables(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = re.search(r"BLAS threads per rank: ([\d, ]+)", out.stdout)
    assert found, out.stdout
    assert [int(n) for n in found.group(1).split(",")] == [train_choice("mnist_mlp", 2, tmp_path)] * 2, out.stdout


@pytest.mark.slow
def test_bench_cost_in_job_uses_trains_thread_choice(tmp_path):
    cmd = mpiexec_command(2) + [sys.executable, "scripts/bench_cost.py", "--in-job", "--nets", "mnist_mlp",
                                "--schemes", "data", "--repeat", "1", "--steps", "2"]
    out = subprocess.run(cmd, cwd=ROOT, env=no_thread_variables(XDG_CACHE_HOME=str(tmp_path)),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = re.search(r"mnist_mlp +data +n=2.*BLAS threads per rank ([\d, ]+)", out.stdout)
    assert found, out.stdout
    assert [int(n) for n in found.group(1).split(",")] == [train_choice("mnist_mlp", 2, tmp_path)] * 2, out.stdout
