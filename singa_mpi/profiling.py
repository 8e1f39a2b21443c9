"""Where a training step's time goes, per worker and layer: ``WORKSPACE/profile.json`` and the
``singa-mpi train --profile`` table, both from the tracer's totals (:mod:`singa_mpi.tracing`).

``profile.json`` (written by the root at the end of every run)::

    {"steps": N,                     # training steps of this run
     "ranks": [[{"cat": "forward", "name": "fc1", "calls": 1.0, "bytes": 0.0, "seconds": 0.0004}, ...],
               ...],                 # worker r's totals per training step
     "evaluation": [[...], ...],     # worker r's test/validation passes, whole-run totals
     "missing": [2, 3]}              # a run that failed under MPI only: the workers it holds no rows of

A run that fails on one rank under MPI is aborted before the workers' totals can be gathered: the
rank that fails writes the profile itself (:func:`build_partial`), from its own totals up to the
failure and, under ``--trace``, the other workers' from the spans of their timeline part files
(:func:`part_from_spans`, :mod:`singa_mpi.timeline_parts`), each up to its last written step and
without the set-up before the trace began.  A rank killed outright leaves that to its guardian
(:mod:`singa_mpi.communication.guardian`), which builds the profile from every rank's part with the
standard library alone: so does this module (it imports :mod:`singa_mpi.tracing` alone of the package).

``ranks`` counts everything the run did outside test and validation passes (setup,
checkpoints, metric reductions included), divided by the steps trained; ``cat`` is ``comm``
(one row per connection layer or sync label: bytes sent+received), ``step`` (trainer phases),
or a layer pass (``forward``, ``backward``, an algorithm's phase).  A layer's pass time
includes the communication it waits in.  The ``--profile`` table and ``plot --profile`` leave the
run's bookkeeping rows out (set-up, verdicts, final gathers: ``BOOKKEEPING_ROWS``): spread
over the steps they would read as a per-step cost.  ``--debug`` shows them in the table.
"""
from __future__ import annotations

import json
import os

import bisect

from singa_mpi.tracing import Span, Total, Tracer

FILE = "profile.json"
STEP_ORDER = {"train_one_batch": 0, "sync": 1, "update": 2}  # the trainer's phases first, in step order
EVALUATION_PASSES = ("test", "val")  # the trainer's "step" spans of its test and validation passes
# rows of the communication table (singa_mpi.progress) and of the profile that are the run's own bookkeeping,
# not a cost a user can change: exchanges of Python objects (verdicts, checkpoints' pieces, summaries),
# barriers, communicator and shared-memory set-up, the vote on stop signals each step, rank 0's choices
# sent to the others
BOOKKEEPING_ROWS = frozenset({"allgather(objects)", "gather(objects)", "barrier", "communicators", "shared memory",
                              "stop-signal vote", "partition_dim: auto", "prediction", "calibrate",
                              "calibrate(hosts)"})


def subtract(after: dict, before: dict) -> dict:
    """Totals accumulated between two :meth:`Tracer.snapshot` calls."""
    out = {}
    for key, total in after.items():
        old = before.get(key, Total())
        if total.calls != old.calls:
            out[key] = Total(total.calls - old.calls, total.bytes - old.bytes, total.seconds - old.seconds)
    return out


def add(into: dict, more: dict) -> dict:
    for key, total in more.items():
        mine = into.setdefault(key, Total())
        mine.calls += total.calls
        mine.bytes += total.bytes
        mine.seconds += total.seconds
    return into


def _rows(totals: dict, steps: int) -> list[dict]:
    per = max(steps, 1)
    return [{"cat": cat, "name": name, "calls": total.calls / per, "bytes": total.bytes / per,
             "seconds": total.seconds / per} for (cat, name), total in totals.items()]


def worker_part(tracer: Tracer, evaluation: dict) -> dict:
    """This worker's share of the profile: training totals (everything but ``evaluation``) and
    the evaluation totals; the steps trained are the trainer's ``train_one_batch`` spans."""
    training = subtract(tracer.snapshot(), evaluation)
    steps = training.get(("step", "train_one_batch"), Total()).calls
    return {"steps": steps, "train": _rows(training, steps), "evaluation": _rows(evaluation, 1)}


def part_from_spans(spans: list[Span]) -> dict:
    """A worker's :func:`worker_part` from the spans it recorded (its --trace part file): a span within
    a test or validation pass counts as evaluation.  What the worker did before its recording began
    (set-up) is not in it."""
    passes = sorted((s.start, s.start + s.duration) for s in spans if s.cat == "step" and s.name in EVALUATION_PASSES)
    begins = [begin for begin, _ in passes]
    training: dict = {}
    evaluation: dict = {}
    for span in spans:
        at = bisect.bisect_right(begins, span.start) - 1  # the last pass begun by the span's start
        inside = at >= 0 and span.start + span.duration <= passes[at][1] + 1e-9  # (sums of rounded floats)
        total = (evaluation if inside else training).setdefault((span.cat, span.name), Total())
        total.calls += 1
        total.bytes += span.bytes
        total.seconds += span.duration
    steps = training.get(("step", "train_one_batch"), Total()).calls
    return {"steps": steps, "train": _rows(training, steps), "evaluation": _rows(evaluation, 1)}


def build(parts: list[dict]) -> dict:
    """The profile from every worker's :func:`worker_part` (in rank order)."""
    return {"steps": parts[0]["steps"] if parts else 0, "ranks": [p["train"] for p in parts],
            "evaluation": [p["evaluation"] for p in parts]}


def build_partial(parts: dict[int, dict], size: int) -> dict:
    """The profile of a run that failed under MPI from the workers' parts it has (rank -> part, of
    :func:`worker_part` or :func:`part_from_spans`) of its ``size``: a worker with no part has no rows
    and is listed in ``missing``; ``steps`` are those of the worker that trained most."""
    ranks = range(max([size] + [rank + 1 for rank in parts]))
    nothing = {"steps": 0, "train": [], "evaluation": []}
    profile = build([parts.get(rank, nothing) for rank in ranks])
    profile["steps"] = max((part["steps"] for part in parts.values()), default=0)
    profile["missing"] = [rank for rank in ranks if rank not in parts]
    return profile


def failed_file(attempt: int | None) -> str:
    """The name of a failed run's profile in its workspace: profile.json, or attempt N's of ``singa-mpi run
    --elastic`` (``attempt``: :func:`singa_mpi.run_events.attempt`) ``profile.attemptN.json``, which the
    restart's profile.json does not replace."""
    stem, suffix = os.path.splitext(FILE)
    return FILE if attempt is None else f"{stem}.attempt{attempt}{suffix}"


def write(workspace: str, profile: dict, name: str = FILE) -> str:
    """WORKSPACE/profile.json (or ``name``), whole or not at all (an OSError, no temporary file left)."""
    path = os.path.join(workspace, name)
    write_file(path, profile)
    return path


def write_file(path: str, profile: dict) -> None:
    """``profile`` to ``path`` as :func:`write` writes it (the guardian of a vanished rank too)."""
    from singa_mpi.durable import write_whole

    write_whole(path, json.dumps(profile, indent=1))


def is_bookkeeping(row: dict) -> bool:
    """Whether ``row`` is the run's own bookkeeping (set-up, verdicts, the final gathers), as the
    communication table counts it: spread over the steps it would read as a per-step cost."""
    return row["cat"] == "comm" and row["name"] in BOOKKEEPING_ROWS


def shown_rows(rows: list[dict], debug: bool = False) -> list[dict]:
    """The rows a table or chart shows: the bookkeeping rows only with ``debug``."""
    return rows if debug else [row for row in rows if not is_bookkeeping(row)]


def layer_rows(rows: list[dict]) -> tuple[list[str], list[str], dict[str, dict]]:
    """(passes, labels, cells): the pass categories and labels in first-seen order; ``cells[label]``
    maps each pass to seconds per step, and ``comm``/``bytes`` to communication per step."""
    passes: list[str] = []
    cells: dict[str, dict] = {}
    for row in rows:
        cat, name = row["cat"], row["name"]
        if cat == "step":
            continue
        cell = cells.setdefault(name, {})
        if cat == "comm":
            cell["comm"] = cell.get("comm", 0.0) + row["seconds"]
            cell["bytes"] = cell.get("bytes", 0.0) + row["bytes"]
        else:
            if cat not in passes:
                passes.append(cat)
            cell[cat] = cell.get(cat, 0.0) + row["seconds"]
    layers = [n for n in cells if any(p in cells[n] for p in passes)]
    labels = layers + [n for n in cells if n not in layers]
    return passes, labels, cells


def format_table(profile: dict, debug: bool = False) -> str:
    """The ``--profile`` table: per worker and layer label, ms per step in each pass and in
    communication calls, and KiB sent+received per step; then each worker's step phases.  The run's
    bookkeeping rows (set-up, verdicts, final gathers) only with ``debug``, as in the communication table."""
    steps = profile["steps"]
    if not steps:
        return "profile: this run trained no step: nothing per step to show"
    lines = [(f"profile: per training step over {steps} steps (test/validation passes left out; "
              f"a layer's time includes the communication it waits in):")]
    passes = []
    tables = []
    hidden_labels: set[str] = set()
    hidden_seconds = 0.0  # the most any rank's hidden rows hold
    for rows in profile["ranks"]:
        shown = shown_rows(rows, debug)
        mine, labels, cells = layer_rows(shown)
        passes += [p for p in mine if p not in passes]
        tables.append((labels, cells, shown))
        left_out = [] if debug else [row for row in rows if is_bookkeeping(row)]
        hidden_labels |= {row["name"] for row in left_out}
        hidden_seconds = max(hidden_seconds, sum(row["seconds"] for row in left_out))
    width = max([len("layer")] + [len(label) for labels, _, _ in tables for label in labels])
    lines.append(f"  {'rank':>4}  {'layer':<{width}}" + "".join(f"{p + ' ms':>13}" for p in passes)
                 + f"{'comm ms':>10}{'comm KiB':>10}")
    for rank, (labels, cells, rows) in enumerate(tables):
        for label in labels:
            cell = cells[label]
            row = f"  {rank:>4}  {label:<{width}}"
            row += "".join(f"{1e3 * cell[p]:>13.3f}" if p in cell else f"{'-':>13}" for p in passes)
            if "comm" in cell:
                row += f"{1e3 * cell['comm']:>10.3f}{cell['bytes'] / 2**10:>10.1f}"
            else:
                row += f"{'-':>10}{'-':>10}"
            lines.append(row)
    for rank, (_, _, rows) in enumerate(tables):
        phases = {r["name"]: r["seconds"] for r in rows if r["cat"] == "step"}
        phases = dict(sorted(phases.items(), key=lambda kv: STEP_ORDER.get(kv[0], len(STEP_ORDER))))
        comm = sum(r["seconds"] for r in rows if r["cat"] == "comm")
        parts = ", ".join(f"{name} {1e3 * seconds:.3f}" for name, seconds in phases.items())
        lines.append(f"  rank {rank}: ms per step: {parts}; in communication calls {1e3 * comm:.3f}")
    if hidden_labels:
        lines.append(f"  ({len(hidden_labels)} rows of the run's own bookkeeping not shown (set-up, verdicts, "
                     f"final gathers), up to {1e3 * hidden_seconds:.3f} ms per step on a rank: --debug shows them)")
    return "\n".join(lines)
