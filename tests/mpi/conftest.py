"""MPI test helpers: these tests run under `mpiexec -n N python -m pytest tests/mpi`.

tests/communication/test_mpi_suites.py launches them for N = 1..4 from a plain pytest run.
Every assertion goes through :func:`agree`, which allreduces the verdict so
that all ranks fail (or pass) together: a failure never leaves a rank waiting.
"""
import os

import pytest

from singa_mpi.communication import mpi as comm_module

# the scratch folder the tests write into (rank-suffixed names); the README's command names a fresh one
if "SINGA_MPI_TEST_TMP" in os.environ:
    os.makedirs(os.environ["SINGA_MPI_TEST_TMP"], exist_ok=True)


@pytest.fixture(scope="session")
def world():
    return comm_module.world()


def agree(world, ok: bool, message: str = "") -> None:
    """Assert ``ok`` on every rank; the failure names the ranks that disagreed."""
    verdicts = world.allgather_object((bool(ok), message))
    bad = [(rank, msg) for rank, (good, msg) in enumerate(verdicts) if not good]
    assert not bad, "; ".join(f"rank {rank}: {msg}" for rank, msg in bad)
