"""What the benchmark scripts share: launching singa_mpi in a subprocess, serially or on N ranks.

    from benchkit import train_subprocess, verdict      (the scripts run with scripts/ on sys.path)
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from singa_mpi.communication.launchers import find_launcher


def bench_env() -> dict[str, str]:
    """One BLAS thread per process, and what the launcher's MPI needs (as tests/test_mpi_suites.py)."""
    return find_launcher().environ(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                                   PYTHONUNBUFFERED="1")


def mpiexec_command(n: int) -> list[str]:
    """The launcher of $SINGA_MPI_FLAVOR (mpich or openmpi; default MPICH), with its flags for a shared box."""
    return find_launcher().command(n)


def train_subprocess(conf: pathlib.Path, workspace: pathlib.Path, ranks: int) -> list[dict]:
    """`singa-mpi train CONF` on ``ranks`` ranks with one BLAS thread each; its metrics.jsonl entries."""
    cmd = [sys.executable, "-m", "singa_mpi", "train", str(conf), "--workspace", str(workspace)]
    if ranks > 1:
        cmd = mpiexec_command(ranks) + cmd
    out = subprocess.run(cmd, check=False, env=bench_env(), capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"singa_mpi on {ranks} rank(s) failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in (workspace / "metrics.jsonl").read_text().splitlines() if line.strip()]


def verdict(ok: bool) -> str:
    return "goal met" if ok else "goal missed"
