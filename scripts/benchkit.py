"""What the benchmark scripts share: launching singa_mpi in a subprocess, serially or on N ranks, and
giving a script's own process the BLAS threads `singa-mpi train` would.

    from benchkit import train_subprocess, verdict      (the scripts run with scripts/ on sys.path)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import signal
import subprocess
import sys
from typing import Callable, Iterator

from singa_mpi.communication.launchers import find_launcher


def positive_int(text: str) -> int:
    """An argparse type for counts (ranks, steps, repeats): 0 or less would run nothing, or divide by
    zero deep inside a run, so argparse refuses it in one line."""
    value = int(text) if text.strip().lstrip("+").isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least 1")
    return value


def bench_env() -> dict[str, str]:
    """One BLAS thread per process, and what the launcher's MPI needs (as tests/mpi_jobs.py)."""
    return find_launcher().environ(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                                   PYTHONUNBUFFERED="1")


_THREADS = contextlib.ExitStack()  # the limit blas_threads_as_train set, held until the process ends


def blas_threads_as_train(cfg=None, nworkers: int = 1) -> int:
    """Give this process the BLAS threads `singa-mpi train` would give a rank of ``cfg`` on ``nworkers``
    workers (``singa_mpi.threads.blas_threads``): the user's OMP_NUM_THREADS & co. when set, else this
    node's cores shared among the ranks the launcher started on it (one thread for a small job), and one
    for a BLAS that scipy bundles.  Without ``cfg`` (a script of several jobs) the cores' share.

    Call it at the start of a script that computes, before the numpy work: ranks under mpiexec that
    keep OpenBLAS's default (a thread per core, in numpy's and scipy's BLAS both) oversubscribe the cores
    (``mpiexec -n 2 profile_step.py`` on 2 cores: 486 ms a step instead of 34).  Held until the process
    ends; a later call replaces it.  Returns the threads of the largest BLAS/OpenMP pool now.
    """
    from singa_mpi import threads
    from singa_mpi.checks.job import validate

    def warn(line: str) -> None:
        print(f"warning: {line}", file=sys.stderr, flush=True)

    _THREADS.close()
    work = threads.work_per_step(cfg, validate(cfg), nworkers) if cfg is not None else None
    _THREADS.enter_context(threads.blas_threads(warn=warn, work=work))
    return blas_threads_now()


def blas_threads_now() -> int:
    """The most threads any BLAS or OpenMP library loaded in this process will use (threadpoolctl)."""
    from threadpoolctl import threadpool_info

    return max((lib["num_threads"] for lib in threadpool_info()), default=1)


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


class _Terminated(BaseException):
    """SIGTERM (a time limit, `timeout`) as an exception, so that the loop unwinds (and
    ``subprocess.run`` kills the run under way) like on Ctrl-C."""


@contextlib.contextmanager
def report_if_cut_short(report: Callable[[], None]) -> Iterator[None]:
    """Run a benchmark's loop; if Ctrl-C or SIGTERM ends it early, print what was measured so far
    (``report()``: the table of the runs done) and exit 130 (Ctrl-C) or 143 (SIGTERM)."""
    def terminate(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except (KeyboardInterrupt, _Terminated) as err:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one report
        how = "SIGTERM" if isinstance(err, _Terminated) else "Ctrl-C"
        print(f"\ncut short ({how}): the table of the runs done so far", flush=True)
        report()
        raise SystemExit(143 if isinstance(err, _Terminated) else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def stop_requests() -> Iterator[list[int]]:
    """Under mpiexec: SIGTERM and Ctrl-C noted, not raised.  A rank cannot unwind while it waits inside
    an MPI call, and ranks that stop apart leave the others waiting, so the loop asks at a point every
    rank reaches (``world.any(bool(stops))``) and all stop there together.  Yields the signals noted."""
    stops: list[int] = []

    def note(signum, frame):
        stops.append(signum)

    previous = {number: signal.signal(number, note) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stops
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def exit_code_of(stops: list[int]) -> int:
    """The exit code of a loop cut short by ``stops`` (as report_if_cut_short's: 143 SIGTERM, 130 Ctrl-C)."""
    if not stops:
        return 0
    return 143 if signal.SIGTERM in stops else 130


def verdict(ok: bool) -> str:
    return "goal met" if ok else "goal missed"
