"""What a run tells the supervisor that started it: one JSON line per event, appended to the file named
by ``SINGA_MPI_EVENTS`` (set by ``singa-mpi run --elastic``; without it nothing is written).

Events: ``vanished`` (a guardian names the rank that died without a word: rank, step, host, pid, how
it ended), ``error`` (a rank ends the job after printing what failed: rank, step, exit code, the
message), ``setup_error`` (the launch refused the job before training: exit code, message),
``first_step`` (the first step of a run finished: the end of a restart's recovery) and ``kept`` (the
guardian that named a vanished rank, ``keeps`` under --trace, has written what it could of the attempt's
profile and timeline).  Each line holds ``time`` (seconds since the epoch).  Standard library only: guardians write here too.
"""
from __future__ import annotations

import json
import os
import time

EVENTS_VARIABLE = "SINGA_MPI_EVENTS"
# the supervisor's command up to the job (``singa-mpi run -n 2 --elastic``): a stopped run's "resume with"
SUPERVISOR_VARIABLE = "SINGA_MPI_SUPERVISOR"
# the attempt's number under ``singa-mpi run --elastic``, whose restart writes WORKSPACE/profile.json:
# a failed attempt's profile goes to a file of its own (singa_mpi.profiling.failed_file)
ATTEMPT_VARIABLE = "SINGA_MPI_ATTEMPT"


def note(kind: str, **fields) -> None:
    """Append one event (appends of one short line are atomic, so ranks and guardians may all write)."""
    path = os.environ.get(EVENTS_VARIABLE)
    if not path:
        return
    line = json.dumps({"kind": kind, "time": time.time(), **fields}) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # the supervisor then learns less: the exit code and metrics.jsonl still tell


def attempt() -> int | None:
    """This run's attempt number under ``singa-mpi run --elastic`` (None: not restarted by a supervisor)."""
    number = os.environ.get(ATTEMPT_VARIABLE, "")
    return int(number) if number.isdigit() else None


def read(path: str) -> list[dict]:
    """The events of ``path`` in order (none when it does not exist; a torn last line is skipped)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


__all__ = ["ATTEMPT_VARIABLE", "EVENTS_VARIABLE", "SUPERVISOR_VARIABLE", "attempt", "note", "read"]
