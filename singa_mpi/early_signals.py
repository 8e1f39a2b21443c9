"""Stop signals that come before the launcher is loaded (stdlib only: this runs first).

``python -m singa_mpi train`` and ``singa-mpi train`` load numpy, h5py, protobuf and MPI for a second
or more before the launcher installs its handlers.  A SIGTERM (a scheduler's preemption), SIGUSR1 or
Ctrl-C in that time would end the rank at once, silently, with a signal's exit instead of 75.  So the
entry point calls :func:`catch_for_command` before any other import; the launcher's ``StopSignals``
takes the remembered signal over (:func:`early_stop_signal`) and the job stops before training with
the usual one line and exit 75.  Rank 0 (or a single process) also says so on stderr at once: under
Open MPI's mpirun, whose SIGKILL follows its SIGTERM after ``odls_base_sigkill_timeout`` seconds (1 by
default), a rank still loading is killed before the launcher could print anything.  ``singa-mpi run``
(the supervisor, a second or two of loading too) catches them as well, quietly: the supervisor takes
the signal over and passes it on to the job it launches, whose ranks say it.  Other commands (check,
plan, data) keep Python's defaults.
"""
from __future__ import annotations

import os
import signal
import threading

from singa_mpi import threads  # stdlib only, like this module

_early_signals: list[int] = []
_CATCHING = ("train", "run")  # the commands whose stop signals the launcher (or the supervisor) handles
_QUIET = ("run",)  # the supervisor passes the stop on to the ranks it launches, which say it themselves


def catch_for_command(argv: list[str]) -> None:
    """:func:`catch_stop_signals_early` when ``argv`` (without the program) runs a training command."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command in _CATCHING:
        catch_stop_signals_early(say=command not in _QUIET)


def catch_stop_signals_early(say: bool = True) -> None:
    """Remember a SIGINT, SIGTERM or SIGUSR1 that comes while the package loads (``say``: rank 0 says so
    at once).  A second Ctrl-C meanwhile raises KeyboardInterrupt, as Python would."""

    def remember(signum, frame):
        if signum == signal.SIGINT and _early_signals:
            raise KeyboardInterrupt("second Ctrl-C")
        if say and not _early_signals and threads.world_rank(os.environ) == 0:  # raw write: a handler may interrupt a print
            os.write(2, f"singa-mpi: {signal.Signals(signum).name} while starting: stopping before training; "
                        f"nothing is written\n".encode())
        _early_signals.append(signum)

    remember.early = True  # what the launcher restores is Python's default, not this
    if threading.current_thread() is threading.main_thread():
        from singa_mpi.communication.keeper import stop_signals

        for signum in stop_signals((signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)):
            signal.signal(signum, remember)


def early_stop_signal() -> int | None:
    """The first stop signal :func:`catch_stop_signals_early` caught, if any (and forget it)."""
    return _early_signals.pop(0) if _early_signals else None


def python_default(signum: int, handler):
    """``handler``, or Python's default for ``signum`` if it is :func:`catch_stop_signals_early`'s."""
    if not getattr(handler, "early", False):
        return handler
    return signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
