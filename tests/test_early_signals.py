"""The stop signals caught while the package loads (singa_mpi/early_signals.py): who says so at once."""
import os
import signal

import pytest

from singa_mpi import early_signals, threads


@pytest.fixture
def caught():
    """The handler catch_stop_signals_early installs for SIGUSR1, Python's own put back after."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    early_signals.catch_stop_signals_early()
    try:
        yield signal.getsignal(signal.SIGUSR1)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        while early_signals.early_stop_signal() is not None:
            pass


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_the_rank_that_says_so_is_the_launched_rank_threads_reads(caught, capfd, monkeypatch, rank, said):
    """One reading of the launcher's rank variables (threads.world_rank): a launcher whose variable
    only threads knows still keeps ranks other than 0 quiet."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "RANK_VARIABLES", ("SINGA_MPI_TEST_LAUNCHED_RANK",))
    monkeypatch.setenv("SINGA_MPI_TEST_LAUNCHED_RANK", rank)
    assert threads.world_rank(os.environ) == int(rank)
    caught(signal.SIGUSR1, None)
    assert early_signals.early_stop_signal() == signal.SIGUSR1
    line = "singa-mpi: SIGUSR1 while starting: stopping before training; nothing is written\n"
    assert capfd.readouterr().err == (line if said else "")
