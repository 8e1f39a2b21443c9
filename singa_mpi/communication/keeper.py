"""The keeper: under ``singa-mpi run --elastic`` with MPICH, the process the launcher starts for a
rank, which runs the rank as its child and outlives it.

Why: MPICH's launcher ends every rank within milliseconds of one dying by a signal (even with
``-disable-auto-cleanup`` it sends the others SIGUSR1 then SIGKILL), so survivors never get to write
an emergency checkpoint (:mod:`singa_mpi.checkpoints.emergency`).  A keeper whose child died by a
signal exits 0 instead, which with ``-disable-auto-cleanup`` leaves the other ranks running until they
have saved what they hold and exited; it also tells the supervisor (a ``rank_died`` event), which then
asks the survivors for their state.  Otherwise the keeper is transparent: the child inherits its
environment (MPI's PMI descriptor included), its output and its process group (so the launcher's
stop signals reach the rank), and the keeper exits with the child's exit code: the codes every rank
ends with together (done, refused, stopped, ...) as they are; any other (a rank that failed before
MPI was up, which nothing else would end) by dying itself, so that the launcher ends the job as it
would without the keeper.  (Open MPI 4.1 is not kept: its ``--enable-recovery``, which would leave
survivors running, also stops MPI_Abort from ending a job.)  Standard library only: it runs before
anything else is imported.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from singa_mpi import run_events

KEEPER_VARIABLE = "SINGA_MPI_KEEPER"  # "1": this process keeps a rank (set by the supervisor for MPICH)
KEPT_VARIABLE = "SINGA_MPI_KEPT"  # "1": this process is a kept rank
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
# MPICH's launcher, with -disable-auto-cleanup, tells the ranks of a death with SIGUSR1: a kept rank
# ignores it (a stop reaches it as SIGTERM, which the supervisor sends for MPICH; Slurm's SIGUSR1 goes
# to the supervisor)
FAILURE_NOTICE = signal.SIGUSR1
# exits every rank makes together (done, refused at setup (2, 3, 6), non-finite, stopped): passed on
TOGETHER = (0, 2, 3, 5, 6, 75)


def wanted(environ=None) -> bool:
    return (os.environ if environ is None else environ).get(KEEPER_VARIABLE) == "1"


def kept(environ=None) -> bool:
    """Whether this process is a kept rank."""
    return (os.environ if environ is None else environ).get(KEPT_VARIABLE) == "1"


def stop_signals(signals: tuple) -> tuple:
    """``signals`` without the launcher's failure notice in a kept rank."""
    return tuple(s for s in signals if not (kept() and s == FAILURE_NOTICE))


def keep(argv: list[str]) -> int:
    """Run ``python -m singa_mpi ARGV...`` as a child and return what the launcher should see."""
    for signum in PASSED_ON:  # the launcher signals the process group: the rank acts on it, the keeper waits
        signal.signal(signum, lambda *_: None)  # a handler, not SIG_IGN: exec resets it to the default
    env = {key: value for key, value in os.environ.items() if key != KEEPER_VARIABLE}
    env[KEPT_VARIABLE] = "1"
    child = subprocess.Popen([sys.executable, "-m", "singa_mpi", *argv], env=env, close_fds=False,
                             preexec_fn=lambda: signal.signal(FAILURE_NOTICE, signal.SIG_IGN))
    code = child.wait()
    for signum in PASSED_ON:  # the launcher may signal the group as this process ends: no handler runs then
        signal.signal(signum, signal.SIG_IGN)
    if code < 0 or code >= 128:  # killed, or ended by the MPI library on a dead peer: the others go on
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))
        how = {"signal": _signal_name(-code)} if code < 0 else {"code": code}
        run_events.note("rank_died", rank=int(rank), pid=child.pid, **how)
        return 0
    if code not in TOGETHER:
        os.kill(os.getpid(), signal.SIGKILL)  # the launcher's clean-up ends the others, as without a keeper
    return code


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


__all__ = ["KEEPER_VARIABLE", "KEPT_VARIABLE", "wanted", "kept", "stop_signals", "keep"]
