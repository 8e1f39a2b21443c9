"""Run the MPI test suite (tests/mpi) under mpiexec with 1, 2, 3 and 4 ranks.

Four ranks oversubscribe a 2-core machine: fine for correctness.  Each run has
a hard timeout, so a hang fails the test instead of the CI job.
"""
import os
import subprocess
import sys

import pytest

from mpi_jobs import mpi_env, mpiexec_command

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)


@pytest.mark.parametrize("nranks,shm", [(1, "1"), (2, "1"), (3, "1"), (4, "1"), (2, "0"), (3, "0")],
                         ids=["n1", "n2", "n3", "n4", "n2-allreduce", "n3-allreduce"])
@pytest.mark.slow
def test_mpi_suite(nranks, shm, tmp_path):
    """shm "0": replicated gradients go through bucketed Iallreduce instead of node-shared memory."""
    env = mpi_env(SINGA_MPI_TEST_TMP=str(tmp_path), SINGA_MPI_SHM=shm)
    cmd = mpiexec_command(nranks) + [sys.executable, "-m", "pytest", os.path.join(TESTS, "mpi"), "-q", "-x",
                                     "-p", "no:cacheprovider", "--timeout=600"]
    try:
        result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"MPI suite on {nranks} ranks timed out:\n{(err.stdout or b'')[-3000:]}")
    assert result.returncode == 0, f"MPI suite on {nranks} ranks failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
