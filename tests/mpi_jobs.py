"""Launching test jobs under mpiexec and watching their ranks: the MPI the tests run under, its
environment and command line, the ranks' pids from /proc, a job's first progress and its end.

Shared by the tests that start real MPI jobs: test_mpi_suites.py runs tests/mpi under mpiexec with
it; test_mpi_failures.py, test_mpi_faults.py, test_frameworks.py, the fuzz suite's process faults...
"""
import functools
import os
import pathlib
import signal
import subprocess
import time

import pytest

from singa_mpi.communication.launchers import Launcher, LauncherNotFound, find_launcher


@functools.cache
def launcher() -> Launcher:
    """The MPI the MPI tests run under: $SINGA_MPI_FLAVOR (mpich or openmpi), else MPICH."""
    try:
        return find_launcher()
    except LauncherNotFound as err:
        pytest.fail(str(err))


def mpi_env(**extra: str) -> dict[str, str]:
    """Environment for launching test ranks on this one machine: one BLAS thread per rank, and what
    the launcher's MPI needs (singa_mpi.communication.launchers)."""
    return launcher().environ(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)


def mpiexec_command(n: int) -> list[str]:
    return launcher().command(n)


def launcher_word() -> str:
    """The launcher's name as the ranks it starts name it in their messages (launcher.start.launcher_name):
    Open MPI's mpirun, MPICH's mpiexec."""
    return "mpirun" if launcher().flavor == "openmpi" else "mpiexec"


def rank_pids(marker: str) -> dict[int, int]:
    """PIDs of the singa_mpi processes whose command line contains ``marker``, by MPI rank."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if b"singa_mpi" not in cmdline or not any(marker.encode() in c for c in cmdline):
                continue
            environ = dict(e.split(b"=", 1) for e in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        for key in (b"PMI_RANK", b"OMPI_COMM_WORLD_RANK"):
            if key in environ:
                found[int(environ[key])] = int(pid)
    return found


def wait_for_progress(proc, tmp_path, timeout=120):
    metrics = tmp_path / "ws" / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"job ended early:\n{proc.stdout.read()}\n{proc.stderr.read()}")
        if metrics.exists() and metrics.read_text().count("\n") >= 2:
            return
        time.sleep(0.2)
    pytest.fail("no training progress within the time limit")


def finish(proc, limit):
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"job did not end within {limit}s:\n{out[-2000:]}\n{err[-2000:]}")
    return proc.returncode, out, err


def ranks_of(pid: int) -> dict[int, int]:
    """{MPI rank: pid} of the processes below ``pid`` (mpiexec -> hydra proxy -> ranks), from /proc."""
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    below, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    found = {}  # pid -> MPI rank
    for child in below:
        try:
            env = pathlib.Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            rank = [v.split(b"=", 1)[1] for v in env if v.startswith((b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK="))]
            if b"SINGA_MPI_KEEPER=1" in env:  # a supervised rank's keeper (communication.keeper): its child is the rank
                continue
            if rank and b"python" in pathlib.Path(f"/proc/{child}/cmdline").read_bytes():
                found[child] = int(rank[0])
        except OSError:
            continue
    # A rank's child between its fork and its exec (the guardian, starting) still shows the rank's
    # environment and command line: the rank is the top-most of them.  Taking the child made a
    # signal meant for the rank reach the guardian instead (a fuzz case then trained to the end).
    return {rank: pid for pid, rank in found.items() if parents.get(pid) not in found}
