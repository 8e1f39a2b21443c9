"""Stop signals during a run: SIGINT, SIGTERM and SIGUSR1 finish the step, checkpoint and stop."""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable

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
    acknowledges the first signal on stderr at once and notes the pending stop in stopped.txt.

    Python runs a handler in the main thread only between bytecodes: a rank waiting inside MPI's C code
    (for a rank stuck in a layer) would run it only once the wait ends.  Under MPI a thread therefore
    also reads the signals from the interpreter's wakeup file descriptor (:meth:`watch_from_thread`):
    the root acknowledges at once, and the rank's stall watchdog is armed, which names a rank that
    holds up the stop and ends the job (:meth:`~singa_mpi.communication.liveness.Watchdog.stop_signal`)."""

    def __init__(self, is_root: bool = True):
        self.is_root = is_root
        self.received: int | None = None  # the first stop signal, if any
        self.trainer: Trainer | None = None
        self.finished = False  # the run is over: ignore whatever comes
        self._previous: dict = {}
        self._acknowledged = False
        self._acknowledging = threading.Lock()
        self._watcher: _WakeupWatcher | None = None
        # under MPI: the other ranks of this node that have ended unannounced (a killed rank: the launcher
        # then SIGTERMs the others, Open MPI's mpirun does, and no stop can complete)
        self.ended_ranks: Callable[[], list[int]] = list

    def install(self) -> None:
        from singa_mpi.early_signals import early_stop_signal, python_default

        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: python_default(signum, signal.signal(signum, self._request_stop))
                              for signum in stop_signals(STOP_SIGNALS)}  # a kept rank: not MPICH's notice
            self.received = early_stop_signal()  # one that came while the package loaded (the CLI's)

    def attach(self, trainer: Trainer) -> None:
        """From now on a signal asks ``trainer`` to stop after its step (one received already: at once)."""
        self.trainer = trainer
        if isinstance(trainer, Trainer):
            trainer.acknowledge = self.acknowledge_elsewhere
        if self.received is not None:
            trainer.stop_requested = True
            trainer.stop_signal = self.received

    def watch_from_thread(self, on_signal: Callable[[str], None]) -> None:
        """Under MPI, after :meth:`install`: each stop signal is also seen by a thread as it arrives,
        which acknowledges it (root) and calls ``on_signal(name)``, even while the main thread waits
        in MPI's C code."""
        if self._previous and self._watcher is None:
            self._watcher = _WakeupWatcher(tuple(self._previous), self._seen_from_thread, on_signal)

    def restore(self, keep_ignoring: bool) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if keep_ignoring else handler)
        self._previous = {}
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

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
            self._acknowledge_once(signum)

    def acknowledge_elsewhere(self, signum: int) -> None:
        """Root: the stop signal ``signum`` reached another rank alone (a server, a worker of another
        group or of its own), as the stop's vote told: acknowledged as one that reached the root."""
        if not self.finished and self.is_root:
            self._acknowledge_once(signum, elsewhere=True)

    def _seen_from_thread(self, signum: int) -> None:
        if not self.finished and self.is_root:
            self._acknowledge_once(signum)

    def _acknowledge_once(self, signum: int, elsewhere: bool = False) -> None:
        with self._acknowledging:  # the handler or the watcher thread, whichever sees the signal first
            if self._acknowledged:
                return
            self._acknowledged = True
        self._acknowledge(signum, elsewhere)

    def _acknowledge(self, signum: int, elsewhere: bool = False) -> None:
        """Root, on the first stop signal (``elsewhere``: one that reached another rank alone): one line
        on stderr at once (raw write: a handler may interrupt a print), and while training the pending
        stop in WORKSPACE/stopped.txt, naming the newest good checkpoint there is, in case the launcher ends
        the run before the stop's checkpoint is written.  Where another rank of this node has ended
        unannounced (killed: the signal is the launcher ending the job), both say that no checkpoint
        can be written instead of promising one."""
        name = "Ctrl-C" if signum == signal.SIGINT else signal_name(signum)
        name += " (it reached another rank)" if elsewhere else ""
        again = " (Ctrl-C again to abort without one)" if signum == signal.SIGINT and not elsewhere else ""
        trainer = self.trainer
        if trainer is None or not trainer.training:  # setting up: the run stops before training
            os.write(2, f"singa-mpi: {name}: stopping before training starts; nothing is written\n".encode())
            return
        step = trainer.runtime.tracer.step
        there = checkpoint.newest_good_said(trainer.workspace)
        ended = self.ended_ranks()
        if ended:  # the launcher's end of the job, not a stop: the step cannot finish, nothing is written
            ranks = f"rank {ended[0]} has" if len(ended) == 1 else f"ranks {', '.join(map(str, ended))} have"
            line = f"{ranks} ended, so the launcher is ending the job: no checkpoint can be written; {there}"
            note = write_stop_note(trainer.workspace, [f"{signal_name(signum)} at step {step}: {line}"])
            os.write(2, f"singa-mpi: {name}: {line}{f' (also in {note})' if note else ''}\n".encode())
            return
        note = write_stop_note(trainer.workspace, [
            f"{signal_name(signum)} at step {step}: stopping after this step and writing a checkpoint; if the run "
            f"ends before it is written, {there}"])
        said = f"; what was saved: {note}" if note else ""
        os.write(2, f"singa-mpi: {name}: stopping after this step and writing a checkpoint{again}{said}\n".encode())


class _WakeupWatcher(threading.Thread):
    """Reads the signal numbers CPython writes to its wakeup file descriptor as each signal arrives
    (``signal.set_wakeup_fd``), before the main thread can run the handler."""

    def __init__(self, watched: tuple, seen: Callable[[int], None], on_signal: Callable[[str], None]):
        super().__init__(name="singa-mpi-stop-signals", daemon=True)
        self.watched, self.seen, self.on_signal = watched, seen, on_signal
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)  # the interpreter's write must never block
        self.previous = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
        self.armed = False
        self.start()

    def run(self) -> None:
        try:
            while True:
                numbers = os.read(self.read_end, 64)
                if not numbers or 0 in numbers:  # closed, or close()'s wake-up
                    return
                for signum in numbers:
                    if signum in self.watched:
                        self._stop_signal(signum)
        finally:
            os.close(self.read_end)

    def _stop_signal(self, signum: int) -> None:
        self.seen(signum)
        if not self.armed:
            self.armed = True
            self.on_signal("Ctrl-C" if signum == signal.SIGINT else signal_name(signum))

    def close(self) -> None:
        signal.set_wakeup_fd(self.previous)
        os.write(self.write_end, b"\0")
        self.join(timeout=1.0)
        os.close(self.write_end)
