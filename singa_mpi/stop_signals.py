"""Stop signals during a run: SIGINT, SIGTERM and SIGUSR1 finish the step, checkpoint and stop."""
from __future__ import annotations

import os
import signal
import threading

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.communication.keeper import stop_signals
from singa_mpi.trainer import Trainer, signal_name, write_stop_note

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
STOPPED_BEFORE_TRAINING = ("stopped on a signal before training started: no checkpoint written; run the same "
                           "command again to start")


class StopSignals:
    """SIGINT (Ctrl-C), SIGTERM and SIGUSR1 (Slurm's warning before the time limit) from the start of a
    run to its end: finish the step, checkpoint, stop (exit 75); before training starts, stop there
    (exit 75, nothing written, STOPPED_BEFORE_TRAINING).  A second SIGTERM or SIGUSR1 changes nothing
    (the checkpoint under way is finished); a second Ctrl-C aborts at once: KeyboardInterrupt, exit 130.
    Once the run is over, signals are ignored; under MPI they stay ignored after a stop, until the
    process exits, so that a late signal cannot turn exit 75 into a death by signal.

    Under MPICH's mpiexec a Ctrl-C reaches every rank (hydra forwards SIGINT; its own second Ctrl-C
    kills the job); a signal that reaches only some ranks still stops all of them after the same
    step (or before the first), as the ranks vote on it.  Open MPI's mpirun, on SIGTERM or SIGINT, sends
    the ranks SIGCONT, reads none of their output any more, sends SIGTERM ``odls_base_sigkill_timeout``
    seconds later (1 by default) and SIGKILL as long after that, then exits 1: the ranks stop on that
    SIGTERM, their stdout never blocks them (:class:`singa_mpi.progress.ForwardedOutput`), and what the
    stop saved is in WORKSPACE/stopped.txt and, while stdout is not read, on stderr.  The root
    acknowledges the first signal on stderr at once and notes the pending stop in stopped.txt."""

    def __init__(self, is_root: bool = True):
        self.is_root = is_root
        self.received: int | None = None  # the first stop signal, if any
        self.trainer: Trainer | None = None
        self.finished = False  # the run is over: ignore whatever comes
        self._previous: dict = {}

    def install(self) -> None:
        from singa_mpi.early_signals import early_stop_signal, python_default

        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: python_default(signum, signal.signal(signum, self._request_stop))
                              for signum in stop_signals(STOP_SIGNALS)}  # a kept rank: not MPICH's notice
            self.received = early_stop_signal()  # one that came while the package loaded (the CLI's)

    def attach(self, trainer: Trainer) -> None:
        """From now on a signal asks ``trainer`` to stop after its step (one received already: at once)."""
        self.trainer = trainer
        if self.received is not None:
            trainer.stop_requested = True
            trainer.stop_signal = self.received

    def restore(self, keep_ignoring: bool) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if keep_ignoring else handler)
        self._previous = {}

    def _request_stop(self, signum, frame) -> None:
        if self.finished:
            return
        asked = self.received is not None or (self.trainer is not None and self.trainer.stop_requested)
        if signum == signal.SIGINT and asked:
            raise KeyboardInterrupt("second Ctrl-C: stopped without a checkpoint")
        if self.received is None:
            self.received = signum
        if self.trainer is not None:
            self.trainer.stop_requested = True
            self.trainer.stop_signal = self.trainer.stop_signal or signum
        if self.is_root and not asked:
            self._acknowledge(signum)

    def _acknowledge(self, signum: int) -> None:
        """Root, on the first stop signal: one line on stderr at once (raw write: a handler may interrupt
        a print), and while training the pending stop in WORKSPACE/stopped.txt, naming the newest
        checkpoint there is, in case the launcher ends the run before the stop's checkpoint is written."""
        name = "Ctrl-C" if signum == signal.SIGINT else signal_name(signum)
        again = " (Ctrl-C again to abort without one)" if signum == signal.SIGINT else ""
        trainer = self.trainer
        if trainer is None or not trainer.training:  # setting up: the run stops before training
            os.write(2, f"singa-mpi: {name}: stopping before training starts; nothing is written\n".encode())
            return
        step = trainer.runtime.tracer.step
        newest = checkpoint.listed(trainer.workspace)
        there = (f"the newest checkpoint is {newest[0][1]} (step {newest[0][0]})" if newest else
                 "there is no checkpoint (the run would start again at step 0)")
        note = write_stop_note(trainer.workspace, [
            f"{signal_name(signum)} at step {step}: stopping after this step and writing a checkpoint; if the run "
            f"ends before it is written, {there}"])
        said = f"; what was saved: {note}" if note else ""
        os.write(2, f"singa-mpi: {name}: stopping after this step and writing a checkpoint{again}{said}\n".encode())
