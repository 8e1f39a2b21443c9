"""Each rank's part of a ``--trace`` timeline, written to disk as the run goes, so that a run that
fails on one rank still yields every rank's timeline up to the failure.

Under MPI the timeline is gathered to the root once training ends (:func:`timeline.finish`).  A rank
that fails aborts the job instead, and the other ranks' spans, kept in memory, die with them.  So
every rank of an MPI run also appends its new spans, step by step, to its own part file beside the
trace (``trace.rank1.part`` for ``--trace trace.json``).  On a normal end each rank removes its part.
On a failure, the rank that fails (or a survivor that sees the failure as an error) reads every part
it can find of the same run and writes the trace file itself: each rank up to its last written step,
its own up to the failure (a rank killed outright: its guardian, :mod:`singa_mpi.communication.guardian`).

A part is JSON lines: a header ``{"run", "rank", "origin_unix"}``, then one line per step, a list of
its spans ``[name, cat, start, duration, bytes, step, args]``.  Each line is one ``write``, so a part
read while its rank still runs ends at most in one cut line, which the reader drops.  A part whose
``run`` is not this run's (a part left by an older run killed outright) is never read.
"""
from __future__ import annotations

import glob
import json
import os
import time

from singa_mpi.durable import remove_if_there
from singa_mpi.errors import one_line
from singa_mpi.tracing import Span, Tracer

SUFFIX = ".part"
_clock = time.perf_counter


def part_path(trace_path: str, rank: int) -> str:
    """Where rank ``rank`` writes its part of ``trace_path``."""
    stem, _ = os.path.splitext(trace_path)
    return f"{stem}.rank{rank}{SUFFIX}"


def remove_stale(trace_path: str) -> None:
    """Parts an earlier run left beside ``trace_path`` (killed before it could remove them): called on
    the root before the ranks write theirs, so that a later failure merges none of them."""
    for path in _all_parts(trace_path):
        remove_if_there(path)


class PartWriter:
    """One rank's part file: :meth:`flush` appends the spans its tracer recorded since the last call."""

    PAUSE = 49  # times a write's own duration before the next one

    def __init__(self, trace_path: str, tracer: Tracer, run: str):
        self.path = part_path(trace_path, tracer.rank)
        self.tracer = tracer
        self.written = 0  # tracer.events[:written] are in the file
        self.note: str | None = None  # why the part stopped being written (one note, once)
        self.next_at = 0.0  # perf_counter before which flush() writes nothing
        self.run = run
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)  # as the trace's writer does
            self.file = open(self.path, "w", encoding="utf-8")
            self.file.write(json.dumps({"run": run, "rank": tracer.rank, "origin_unix": tracer.origin_unix()}) + "\n")
            self.file.flush()
        except OSError as err:
            self.file = None
            self.note = _unwritable(self.path, err)

    def flush(self) -> None:
        """Append the spans recorded since the last flush (one write), unless the last write ended less
        than 49 times its own duration ago: writing takes at most 2% of a rank's time (a 0.5 ms step of
        the digits job wrote every step 10% slower), and a failed run's trace lacks at most that much of
        the other ranks' last moments (milliseconds).  A failure to write (a full disk) stops this part,
        with one note: the trace is a record, never a reason to stop."""
        if self.file is None or _clock() < self.next_at:
            return
        began = _clock()
        events = self.tracer.events
        if len(events) < self.written:  # the tracer forgot its events (Tracer.reset)
            self.written = 0
        if len(events) == self.written:
            return
        # one line per flush, one dumps over its rows: half the time of a dumps per span
        line = json.dumps([[s.name, s.cat, s.start, s.duration, s.bytes, s.step, s.args] for s in events[self.written:]],
                          separators=(",", ":"), default=str) + "\n"
        try:
            self.file.write(line)
            self.file.flush()
        except OSError as err:
            self.note = _unwritable(self.path, err)
            self.close()
            return
        self.written = len(events)
        ended = _clock()
        self.next_at = ended + self.PAUSE * (ended - began)

    def close(self, remove: bool = False) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
            self.file = None
        if remove:
            remove_if_there(self.path)


def read_parts(trace_path: str, run: str) -> list[tuple[dict, list[Span]]]:
    """Every part of run ``run`` beside ``trace_path`` that this process can read: (header, spans),
    by rank.  A line cut by a rank still writing ends its part."""
    found = []
    for path in _all_parts(trace_path):
        try:
            with open(path, encoding="utf-8") as handle:
                header = json.loads(handle.readline())
                if not isinstance(header, dict) or header.get("run") != run:
                    continue
                spans = []
                for line in handle:
                    try:
                        rows = json.loads(line)
                    except ValueError:  # the last line, being written
                        break
                    spans += [Span(name, cat, header["rank"], start, duration, nbytes, step, args)
                              for name, cat, start, duration, nbytes, step, args in rows]
        except (OSError, ValueError, KeyError):  # gone (its rank finished with it) or not a part
            continue
        found.append((header, spans))
    return sorted(found, key=lambda part: part[0]["rank"])


def remove_parts(trace_path: str, run: str) -> None:
    """The parts of run ``run``, once merged into the trace."""
    for header, _ in read_parts(trace_path, run):
        remove_if_there(part_path(trace_path, header["rank"]))


def _all_parts(trace_path: str) -> list[str]:
    """The part files beside ``trace_path``, of any run."""
    stem, _ = os.path.splitext(trace_path)
    return [path for path in glob.glob(glob.escape(stem) + ".rank*" + SUFFIX)
            if path[len(stem) + 5:-len(SUFFIX)].isdigit()]


def _unwritable(path: str, err: OSError) -> str:
    return f"note: this rank's part of the timeline stopped being written: {path}: {one_line(err.strerror or str(err))}"
