"""Spans: what each rank did, when, for how long, moving how many bytes.

Three reporters share one :class:`Tracer` per process (per worker):

* the communicator: one span per MPI call (category ``"comm"``), named after
  the connection layer or sync that made it, with the bytes it moved;
* the net: one span per layer and direction (categories ``"forward"``,
  ``"backward"``, or an algorithm's phase name such as ``"positive"``);
* the trainer: one span per phase of a step (category ``"step"``: ``train``,
  ``sync``, ``update``, ``evaluate``, ``checkpoint``).

The tracer always keeps running totals per (category, name) -- calls, bytes,
seconds -- which is what the end-of-run communication table and the profiling
script print, and the stack of open spans, which is what the stall watchdog
reports.  Keeping every event (for a timeline) is off unless ``record=True``;
:mod:`singa_mpi.timeline` writes recorded events as a Chrome trace.
Spans nest per thread of control, so a layer's span contains the
communication spans it caused.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable, Iterator


@dataclasses.dataclass
class Span:
    """One finished span (kept only when recording)."""

    name: str
    cat: str
    rank: int
    start: float  # seconds since the tracer's origin
    duration: float
    bytes: int = 0
    step: int = 0
    args: dict | None = None


@dataclasses.dataclass
class Total:
    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclasses.dataclass
class OpenSpan:
    """A span that has begun and not ended: what a rank is inside right now."""

    name: str
    cat: str
    started: float  # perf_counter
    step: int
    direction: str
    args: dict | None = None

    def describe(self) -> str:
        """For the watchdog: 'step 3 backward Recv from rank 1 tag 5 in layer x for 12.0s'."""
        args = self.args or {}
        what = " ".join(str(args[k]) for k in ("op", "peer") if args.get(k))
        tag = f" tag {args['tag']}" if args.get("tag") is not None else ""
        return (f"step {self.step} {self.direction} {what}{tag} in layer {self.name} "
                f"for {time.perf_counter() - self.started:.1f}s")


class Tracer:
    """Span collector of one rank (see the module docstring).

    ``step``, ``phase`` and ``direction`` describe where the rank is; the trainer,
    the algorithm and the sync strategies set them, and every span records them.
    """

    def __init__(self, rank: int = 0, record: bool = False):
        self.rank = rank
        self.record = record
        self.origin = time.perf_counter()
        self.events: list[Span] = []
        self.totals: dict[tuple[str, str], Total] = {}
        self._cat_seconds: dict[str, float] = {}  # per category: read every step, so kept running
        self.stack: list[OpenSpan] = []
        self.step = 0
        self.phase = "train"
        self.direction = "forward"
        # called as a step phase begins (a "step" span: train_one_batch, sync, checkpoint, ...): the
        # liveness record publishes it at once rather than at the next heartbeat, so a rank killed
        # in the first milliseconds of a checkpoint write is reported as writing it
        self.on_phase: Callable[[], None] | None = None

    # ------------------------------------------------------------- spans
    def begin(self, name: str, cat: str, args: dict | None = None) -> OpenSpan:
        span = OpenSpan(name, cat, time.perf_counter(), self.step, self.direction, args)
        self.stack.append(span)
        if cat == "step" and self.on_phase is not None:
            self.on_phase()
        return span

    def end(self, span: OpenSpan, nbytes: int = 0) -> float:
        """Close ``span`` (the innermost open one); returns its duration in seconds."""
        now = time.perf_counter()
        if self.stack and self.stack[-1] is span:
            self.stack.pop()
        else:  # ended out of order (an exception unwound past it): drop it and what it contains
            while self.stack and self.stack.pop() is not span:
                pass
        seconds = now - span.started
        total = self.totals.get((span.cat, span.name))
        if total is None:
            total = self.totals[(span.cat, span.name)] = Total()
        total.calls += 1
        total.bytes += nbytes
        total.seconds += seconds
        self._cat_seconds[span.cat] = self._cat_seconds.get(span.cat, 0.0) + seconds
        if self.record:
            self.events.append(Span(span.name, span.cat, self.rank, span.started - self.origin, seconds,
                                    nbytes, span.step, span.args))
        return seconds

    @contextlib.contextmanager
    def span(self, name: str, cat: str, args: dict | None = None) -> Iterator[OpenSpan]:
        opened = self.begin(name, cat, args)
        try:
            yield opened
        finally:
            self.end(opened)

    # ------------------------------------------------------------- reading
    def pending(self, cat: str = "comm") -> OpenSpan | None:
        """The innermost open span of ``cat`` (what a stalled rank waits in), or None."""
        for span in reversed(list(self.stack)):
            if span.cat == cat:
                return span
        return None

    def by_name(self, cat: str) -> dict[str, Total]:
        """Totals of one category, keyed by span name."""
        return {name: total for (c, name), total in self.totals.items() if c == cat}

    def seconds(self, cat: str) -> float:
        """All seconds spent in spans of ``cat`` since the last reset."""
        return self._cat_seconds.get(cat, 0.0)

    def reset(self) -> None:
        """Forget totals and events (e.g. after warm-up steps)."""
        self.totals.clear()
        self._cat_seconds.clear()
        self.events.clear()

    def snapshot(self) -> dict[tuple[str, str], Total]:
        """A copy of the totals (subtract two to get what happened in between)."""
        return {key: dataclasses.replace(total) for key, total in self.totals.items()}

    def origin_unix(self) -> float:
        """The time origin of recorded events in Unix time (as near as this process's clocks tell)."""
        return time.time() - (time.perf_counter() - self.origin)

    def restart_clock(self) -> None:
        """Make now the time origin of recorded events and forget those recorded so far (totals
        are kept).  Called on every rank right after a barrier, it puts all ranks' timelines on
        one clock, to within the barrier's exit skew (microseconds on one node)."""
        self.origin = time.perf_counter()
        self.events.clear()


class NullTracer(Tracer):
    """A tracer that keeps nothing but where the rank is (the default outside the runtimes)."""

    def begin(self, name: str, cat: str, args: dict | None = None) -> OpenSpan:
        return _NULL_SPAN

    def end(self, span: OpenSpan, nbytes: int = 0) -> float:
        return 0.0


_NULL_SPAN = OpenSpan("", "", 0.0, 0, "")
