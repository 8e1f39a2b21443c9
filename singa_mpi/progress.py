"""What rank 0 shows while a job trains and when it ends: the optional live bar and the summary block.

The plain progress lines (:meth:`singa_mpi.trainer.Trainer.record`) are the log and are always
printed.  On an interactive terminal, with tqdm installed (``pip install 'singa_mpi[progress]'``),
rank 0 also draws a live bar below them; when stdout is a file or a pipe (Slurm logs, ``mpirun``'s
forwarding of other ranks' output) there is no bar.  ``TQDM_DISABLE=1`` turns the bar off.

The summary block is built from plain data, so it can be tested without a run::

    summary_lines(run={"start": 0, "end": 100, "total": 100, "wall": 12.3, ...},
                  ranks=[{"rank": 0, "wall": 12.3, "comm": 1.2, "steps": 100, "step": 9.1, "step_comm": 1.0}, ...])

On a rank that a launcher started, stdout goes through :class:`ForwardedOutput`: the launcher forwards
it, and a launcher that stops reading must not stop the run (Open MPI's mpirun reads nothing from the
moment it is signalled until it has killed the ranks; a rank blocked on a full buffer never reaches the
stop vote).
"""
from __future__ import annotations

import collections
import contextlib
import io
import os
import sys
import threading
import time
from typing import Callable, Iterator

from singa_mpi.profiling import BOOKKEEPING_ROWS


def format_seconds(seconds: float) -> str:
    """``3.2s``, ``4m05s``, ``2h07m``: short enough for a progress line."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def eta(steps: int, seconds: float, left: int, least: int = 2) -> float | None:
    """Seconds for ``left`` more steps at the pace of the last ``steps`` (taking ``seconds``); None until
    ``least`` steps are timed (the pace is timed from the end of a run's first step, whose start-up,
    first batches and step-0 test would make a short job's first ETA hours long)."""
    if steps < least:
        return None
    return seconds / steps * left


class ForwardedOutput(io.TextIOBase):
    """``sys.stdout`` of a launched rank: :meth:`write` queues the text and returns at once; a thread
    writes it to ``stream``'s file descriptor (with no lock a blocked write could hold at exit).

    Why: the launcher forwards this output and may stop reading it.  Open MPI's mpirun, once signalled,
    reads nothing until it has killed the ranks: a progress line per step filled the terminal buffer
    between them, rank 0 blocked in write() before the stop vote, the other ranks waited for it, and the
    run was lost without a checkpoint.  Lines still queued when the process ends are lost; what matters
    is said on stderr too while stdout is :meth:`stalled`, and kept in the workspace (stopped.txt)."""

    STALLED = 0.5  # seconds one write may take before the reader counts as gone
    LIMIT = 100_000  # queued pieces kept while nobody reads (the newest; the count dropped is told)

    def __init__(self, stream):
        super().__init__()
        self.stream = stream
        self.fd = stream.fileno()
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self._queue: collections.deque[str] = collections.deque()
        self._dropped = 0
        self._ready = threading.Condition()
        self._writing_since: float | None = None  # when the write under way began
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="singa-mpi stdout", daemon=True)
        self._thread.start()

    @property
    def encoding(self) -> str:
        return self._encoding

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # the launcher forwards it: no live bar (Open MPI gives the ranks a pseudo-terminal)

    def fileno(self) -> int:
        return self.fd

    def write(self, text: str) -> int:
        with self._ready:
            if len(self._queue) >= self.LIMIT:
                self._queue.popleft()
                self._dropped += 1
            self._queue.append(text)
            self._ready.notify()
        return len(text)

    def flush(self) -> None:
        pass  # the thread writes as soon as it can; waiting here would block on a launcher that reads nothing

    def stalled(self) -> bool:
        """Whether the reader has not taken a write for ``STALLED`` seconds (the launcher stopped reading)."""
        since = self._writing_since
        return since is not None and time.monotonic() - since > self.STALLED

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until the queue is written, for up to ``timeout`` seconds, not at all while stalled."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stalled():
            with self._ready:
                if not self._queue and self._writing_since is None:
                    return
            time.sleep(0.01)

    def close(self, timeout: float = 5.0) -> None:
        """:meth:`drain`, then stop the writer."""
        self.drain(timeout)
        with self._ready:
            self._closed = True
            self._ready.notify()
        super().close()

    def _drain(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    return
                text, self._queue = "".join(self._queue), collections.deque()
                if self._dropped:
                    text = f"[singa-mpi: {self._dropped} earlier output pieces dropped: nobody read them]\n" + text
                    self._dropped = 0
                self._writing_since = time.monotonic()
            data = text.encode(self._encoding, "replace")
            try:
                while data:
                    data = data[os.write(self.fd, data):]
            except OSError:  # the reader is gone (EPIPE, EIO): nothing more can be shown
                return
            finally:
                self._writing_since = None


@contextlib.contextmanager
def forwarded_stdout(launched: bool) -> Iterator[ForwardedOutput | None]:
    """On a rank a launcher started (``launched``), ``sys.stdout`` is a :class:`ForwardedOutput` inside."""
    if not launched or isinstance(sys.stdout, ForwardedOutput) or not hasattr(sys.stdout, "fileno"):
        yield None
        return
    original = sys.stdout
    try:
        original.flush()
        output = ForwardedOutput(original)
    except (OSError, ValueError, io.UnsupportedOperation):  # no file descriptor (captured in a test)
        yield None
        return
    sys.stdout = output
    try:
        yield output
    finally:
        sys.stdout = original
        output.close()


def stdout_stalled() -> bool:
    """Whether this process's stdout is a :class:`ForwardedOutput` nobody has read for a while."""
    return isinstance(sys.stdout, ForwardedOutput) and sys.stdout.stalled()


def drain_stdout(timeout: float = 2.0) -> None:
    """Before this process ends abruptly (MPI_Abort): let a :class:`ForwardedOutput` write what it holds."""
    if isinstance(sys.stdout, ForwardedOutput):
        sys.stdout.drain(timeout)


def also_on_stderr(line: str) -> None:
    """``line`` on stderr too when stdout is stalled (what a stop saved must not be lost with it)."""
    if stdout_stalled():
        os.write(2, f"singa-mpi: {line}\n".encode(errors="replace"))


class LiveBar:
    """A tqdm bar over the training steps; lines printed through :meth:`write` stay above it."""

    def __init__(self, bar):
        self.bar = bar

    def write(self, log: Callable[[str], None], line: str) -> None:
        with self.bar.external_write_mode(file=sys.stdout):
            log(line)

    def advance(self, steps: int = 1) -> None:
        self.bar.update(steps)

    def show(self, text: str) -> None:
        self.bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        self.bar.close()


def open_bar(total: int, initial: int) -> LiveBar | None:
    """A live bar when stdout is an interactive terminal and tqdm is installed, else None."""
    isatty = getattr(sys.stdout, "isatty", None)
    if isatty is None or not isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return LiveBar(tqdm(total=total, initial=initial, unit="step", file=sys.stdout, dynamic_ncols=True,
                        leave=False))


@contextlib.contextmanager
def bar_around(log_owner, bar: LiveBar | None):
    """Route ``log_owner.log`` through ``bar`` while it is open (so lines do not tear the bar)."""
    if bar is None:
        yield
        return
    plain = log_owner.log
    log_owner.log = lambda line: bar.write(plain, line)
    try:
        yield
    finally:
        bar.close()
        log_owner.log = plain


def _best(entries: list[dict], key: str, best: Callable) -> dict | None:
    scored = [e for e in entries if isinstance(e.get(key), float) and e[key] == e[key]]  # no NaN
    return best(scored, key=lambda e: e[key]) if scored else None


def evaluation_line(entries: list[dict]) -> str | None:
    """``final loss 0.31 accuracy 0.91 (step 100); best accuracy 0.92 (step 80), best loss 0.30 (step 80)``."""
    if not entries:
        return None
    final = entries[-1]
    parts = [f"{k} {final[k]:.4f}" for k in ("loss", "squared_error", "accuracy") if k in final]
    text = "final " + " ".join(parts) + f" (step {final['step']})"
    best = []
    # lower is better for a loss and for an RBM's reconstruction error (squared_error)
    for key, pick in (("accuracy", max), ("loss", min), ("squared_error", min)):
        entry = _best(entries, key, pick)
        if entry is not None:
            best.append(f"best {key} {entry[key]:.4f} (step {entry['step']})")
    return text + ("; " + ", ".join(best) if best else "")


def format_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'; 3.2e9 -> '3.0 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def peak_rss() -> int | None:
    """This process's peak resident memory in bytes (Linux reports KiB), None where unknown."""
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError, ValueError):
        return None


def communication_table(rows: list[dict[str, tuple[int, int, float]]], steps: int, debug: bool = False) -> str:
    """The end-of-run communication table: per row (a connection layer, the parameter sync, the metrics'
    reduction) and worker, MiB sent+received and ms per step.  ``rows``: per worker {label: (calls,
    bytes, seconds)}; the run's bookkeeping rows (``BOOKKEEPING_ROWS``) only with ``debug``."""
    labels = sorted({label for per_rank in rows for label in per_rank})
    shown = labels if debug else [label for label in labels if label not in BOOKKEEPING_ROWS]
    lines = [f"communication per step over {steps} steps (per worker: MiB sent+received / ms):",
             f"  {'layer':<38}" + "".join(f"{'worker ' + str(r):>18}" for r in range(len(rows)))]
    for label in shown:
        cells = []
        for per_rank in rows:
            calls, nbytes, seconds = per_rank.get(label, (0, 0, 0.0))
            cells.append(f"{nbytes / steps / 2**20:>9.2f} /{1e3 * seconds / steps:>6.2f}" if calls else f"{'-':>16}")
        lines.append(f"  {label:<38}" + "".join(f"{c:>18}" for c in cells))
    if len(shown) < len(labels):
        lines.append(f"  ({len(labels) - len(shown)} rows of the run's own bookkeeping not shown: --debug shows them)")
    return "\n".join(lines)


def summary_lines(run: dict, ranks: list[dict]) -> list[str]:
    """The end-of-run block.

    ``run`` (rank 0's view): ``start``, ``end``, ``total`` (steps), ``wall`` (this process's seconds),
    ``elapsed`` (seconds since step 0, across resumes), ``samples`` (rows trained here), ``test`` and
    ``val`` (their metrics.jsonl entries), ``checkpoint`` (the last path written), ``stopped``.
    ``ranks``: per rank ``rank``, ``wall``, ``comm`` (seconds inside communication calls),
    ``steps``, ``step`` (seconds in training steps), ``step_comm`` (communication within them),
    ``rss`` (the process's peak resident memory in bytes, when known).
    """
    steps = run["end"] - run["start"]
    wall = max(run["wall"], 1e-9)
    how = "stopped on a signal" if run.get("stopped") else "done"
    resumed = f", resumed from step {run['start']}" if run["start"] else ""
    lines = ["run summary:",
             f"  steps           {run['end']}/{run['total']} ({how}; {steps} in this run{resumed})"]
    since = f" ({format_seconds(run['elapsed'])} since step 0)" if run["start"] else ""
    lines.append(f"  wall time       {format_seconds(run['wall'])}{since}")
    lines.append(f"  samples/s       {run['samples'] / wall:,.0f} (mean over this run's wall time)")
    for phase in ("test", "val"):
        text = evaluation_line(run.get(phase) or [])
        if text:
            lines.append(f"  {phase:<15} {text}")
    if run.get("checkpoint"):
        lines.append(f"  checkpoint      {run['checkpoint']}")
    peaks = [r["rss"] for r in ranks if r.get("rss")]
    if peaks:
        spread = f" (ranks: {format_bytes(min(peaks))}-{format_bytes(max(peaks))})" if len(peaks) > 1 else ""
        lines.append(f"  peak memory     {format_bytes(peaks[0])} resident on rank 0{spread}")
    if len(ranks) > 1:
        shares = [r["comm"] / max(r["wall"], 1e-9) for r in ranks]
        lines.append(f"  communication   {100 * shares[0]:.0f}% of wall time on rank 0 "
                     f"(ranks: {100 * min(shares):.0f}-{100 * max(shares):.0f}%)")
        per_step = [((r["step"] - r["step_comm"]) / max(r["steps"], 1), r["step"] / max(r["steps"], 1), r["rank"])
                    for r in ranks]
        (busy, total, rank), (fast, _, fast_rank) = max(per_step), min(per_step)
        lines.append(f"  slowest rank    {rank}: {1e3 * busy:.1f} ms/step outside communication, "
                     f"{1e3 * total:.1f} ms/step in all (fastest: rank {fast_rank}, {1e3 * fast:.1f} ms)")
    if run.get("pipeline"):
        lines.append(pipeline_line(run["pipeline"], ranks))
    return lines


def pipeline_line(pipeline: tuple[str, int, int, float], ranks: list[dict]) -> str:
    """A pipelined run's measured idle share per rank: the part of its training steps spent waiting
    in communication (for the other stages' micro-batches), beside its schedule's idle share with
    equal slots (the bubble of ``plan``'s timeline)."""
    schedule, micro, stages, bubble = pipeline
    idle = [r["step_comm"] / max(r["step"], 1e-9) for r in ranks]
    from singa_mpi.planner.pipeline import INTERLEAVED

    kind = "virtual stages" if schedule == INTERLEAVED else "stages"
    return (f"  pipeline        {schedule}, {micro} micro-batches, {stages} {kind}: idle {100 * idle[0]:.0f}% of "
            f"step time on rank 0 (ranks: {', '.join(f'{100 * share:.0f}%' for share in idle)}; the bubble of "
            f"its timeline with equal slots: {100 * bubble:.0f}%)")
