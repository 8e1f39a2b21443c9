"""Per-rank timelines as Chrome-trace / Perfetto JSON (``singa-mpi train --trace FILE``).

Open the file in https://ui.perfetto.dev (or chrome://tracing).  Each rank is one process
(``pid`` = its world rank, named "rank r") with these tracks (``tid``):

* 1 ``layers``: each layer's forward and backward (or an algorithm's phase, e.g. ``positive``);
* 2 ``communication``: each MPI call (args: op, peer, bytes, tag, layer), the waits on
  non-blocking requests (``Wait(Iallreduce)``...) and node-shared-memory sums;
* 3 ``trainer``: the phases of a step (``train_one_batch``, ``sync``, ``update``), ``test``/``val``
  passes and ``checkpoint`` writes;
* 10, 11, ... ``in flight``: a non-blocking call from its start to the end of its ``Wait``.
  Requests in flight at the same time (bucketed Iallreduce) get one track each, so that the
  spans of every track nest or are disjoint, as the viewers require.

Every span is a complete event (``ph: "X"``, ``ts``/``dur`` in microseconds, ns resolution) with
``args.step``.  Clock: each rank's ``time.perf_counter()`` minus its tracer's origin, which
:func:`start` (called by the launcher as training begins) restarts on every rank right after a
barrier (:meth:`Tracer.restart_clock`): ranks line up to within the barrier's exit skew
(microseconds on one node) without trusting the nodes' wall clocks to agree, and the trace
begins with training (setup is left out).  ``otherData.origin_unix`` is rank 0's origin in Unix
time.  :func:`finish` gathers every rank's part to the root over the runtime (the job's one
worker group is the whole world) and writes one file.
"""
from __future__ import annotations

import collections
import json
import os
import socket
import uuid

from singa_mpi import timeline_parts
from singa_mpi.durable import NotDurable, not_durable, write_whole
from singa_mpi.errors import DataError
from singa_mpi.tracing import Span, Tracer

LAYERS, COMM, TRAINER, IN_FLIGHT = 1, 2, 3, 10
TRACK_NAMES = {LAYERS: "layers", COMM: "communication", TRAINER: "trainer"}


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _complete(name: str, cat: str, start_ns: int, end_ns: int, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": start_ns / 1000, "dur": max(end_ns - start_ns, 0) / 1000,
            "pid": pid, "tid": tid, "args": args}


def span_events(events: list[Span], pid: int) -> list[dict]:
    """One rank's recorded spans as complete events on the layers/communication/trainer tracks."""
    out = []
    for span in events:
        args: dict = {"step": span.step}
        if span.cat == "comm":
            extra = span.args or {}
            op = extra.get("op") or "?"
            args.update(op=op, peer=extra.get("peer"), bytes=span.bytes, layer=span.name)
            if extra.get("tag") is not None:
                args["tag"] = extra["tag"]
            name, tid = f"{op} {span.name}", COMM
        elif span.cat == "step":
            name, tid = span.name, TRAINER
        else:
            args["pass"] = span.cat
            name, tid = f"{span.name} {span.cat}", LAYERS
        out.append(_complete(name, span.cat, _ns(span.start), _ns(span.start + span.duration), pid, tid, args))
    return out


def in_flight_events(events: list[Span], pid: int) -> list[dict]:
    """Non-blocking calls from their start to the end of their ``Wait``, one track per overlap.

    A wait names what it completes (``Wait(Iallreduce)`` in the same layer or bucket as the
    ``Iallreduce``); requests of one (layer, op) complete in the order they started.  A request
    whose wait is not in the recording (completed after it ended) is left out."""
    started: dict[tuple[str, str], collections.deque] = collections.defaultdict(collections.deque)
    spans = []
    for span in sorted((s for s in events if s.cat == "comm"), key=lambda s: s.start):
        op = (span.args or {}).get("op") or ""
        if op.startswith("Wait(") and op.endswith(")"):
            queue = started.get((span.name, op[5:-1].lower()))
            if queue:
                first = queue.popleft()
                spans.append((_ns(first.start), _ns(span.start + span.duration), first))
        elif op.startswith("I"):
            started[(span.name, op.lower())].append(span)
    lanes: list[int] = []  # end of the last span on each in-flight track
    out = []
    for start, end, first in sorted(spans, key=lambda s: (s[0], -s[1])):
        lane = next((i for i, last in enumerate(lanes) if last <= start), len(lanes))
        if lane == len(lanes):
            lanes.append(end)
        lanes[lane] = end
        extra = first.args or {}
        args = {"step": first.step, "op": extra.get("op"), "peer": extra.get("peer"), "bytes": first.bytes,
                "layer": first.name}
        out.append(_complete(f"{extra.get('op')} {first.name} in flight", "in_flight", start, end, pid,
                             IN_FLIGHT + lane, args))
    return out


def rank_trace(tracer: Tracer) -> dict:
    """This rank's part of the trace: its events and the metadata naming its process and tracks."""
    return part_of(tracer.rank, tracer.events, tracer.origin_unix())


def part_of(pid: int, spans: list[Span], origin_unix: float) -> dict:
    """One rank's part of the trace from its recorded spans (:func:`rank_trace`, or a part read back
    from the file that rank wrote as it ran: :mod:`singa_mpi.timeline_parts`)."""
    events = span_events(spans, pid) + in_flight_events(spans, pid)
    tids = sorted({e["tid"] for e in events} | set(TRACK_NAMES))
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for tid in tids:
        name = TRACK_NAMES.get(tid, f"in flight {tid - IN_FLIGHT + 1}")
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    events.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    return {"rank": pid, "origin_unix": origin_unix, "events": meta + events}


def chrome_trace(parts: list[dict]) -> dict:
    """The whole trace from every rank's :func:`rank_trace`."""
    parts = sorted(parts, key=lambda p: p["rank"])
    return {"traceEvents": [event for part in parts for event in part["events"]],
            "displayTimeUnit": "ms",
            "otherData": {"producer": "singa-mpi train --trace", "ranks": len(parts),
                          "clock": "perf_counter since each rank's origin, restarted after a barrier",
                          "origin_unix": parts[0]["origin_unix"] if parts else None}}


def write(path: str, parts: list[dict], shown: str | None = None) -> str:
    """Write the trace atomically; returns one line saying what was written, naming the file ``shown``
    (the path as the user gave it, where ``path`` is another spelling of it; default ``path``)."""
    trace = chrome_trace(parts)
    shown, caveat = shown or path, ""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # one string: much faster than json.dump's chunks; no temporary file left if it fails
        write_whole(path, json.dumps(trace, separators=(",", ":")))
    except NotDurable as err:  # in place: said as written, and what the disk did
        caveat = f" ({not_durable(err)})"
    except OSError as err:
        raise DataError(f"--trace {shown}: could not write the timeline: {err.strerror or err}") from None
    spans = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    return (f"timeline {shown}: {spans} spans from {len(parts)} rank(s); "
            f"open it in https://ui.perfetto.dev or chrome://tracing{caveat}")


def write_from_parts(path: str, run: str, own: dict | None = None, shown: str | None = None,
                     read: list[tuple[dict, list[Span]]] | None = None) -> tuple[str, list[int]] | None:
    """A run that failed under MPI: the trace from its ranks' part files (:mod:`singa_mpi.timeline_parts`;
    ``read``: as :func:`timeline_parts.read_parts` read them already) and ``own``, the :func:`rank_trace`
    of the rank that writes it (its spans up to the failure, from memory; None from the guardian of a
    rank that vanished); the parts merged are removed.  Returns the line saying what was written
    (naming the file ``shown``, as :func:`write`) and the ranks it holds, or None when there was
    nothing to write."""
    read = [(header, spans) for header, spans in (timeline_parts.read_parts(path, run) if read is None else read)
            if own is None or header["rank"] != own["rank"]]
    parts = [part_of(header["rank"], spans, header["origin_unix"]) for header, spans in read]
    parts += [own] if own is not None else []
    if not parts:
        return None
    line = write(path, parts, shown)
    timeline_parts.remove_parts(path, run)
    return line, sorted(part["rank"] for part in parts)


def start(runtime, path: str | None = None) -> str:
    """Record from now on, with one time origin on every worker (collective over the runtime); returns
    the run's name for its ranks' part files (:mod:`singa_mpi.timeline_parts`), rank 0's, after the root
    removed the parts an earlier run left beside ``path``.

    After a barrier every rank restarts its clock; ranks on rank 0's node then take rank 0's origin,
    as their perf_counter is the node's one monotonic clock: a rank descheduled as it left the
    barrier (an oversubscribed node) would otherwise be milliseconds off.  Other nodes keep the
    barrier's alignment."""
    if path is not None and runtime.is_root:
        timeline_parts.remove_stale(path)
    runtime.tracer.record = True
    runtime.barrier()
    runtime.tracer.restart_clock()
    mine = (socket.gethostname(), runtime.tracer.origin, uuid.uuid4().hex)
    host, origin, run = runtime.allgather_object(mine)[0]
    if host == mine[0]:
        runtime.tracer.restart_clock()  # the exchange above was recorded on this rank's own clock
        runtime.tracer.origin = origin
    return run


def finish(runtime, path: str) -> str | None:
    """Every worker's events to the root, which writes ``path`` (collective); returns the line
    to print on the root, None elsewhere."""
    parts = runtime.gather_object(rank_trace(runtime.tracer))
    if parts is None or not runtime.is_root:
        return None
    line = write(path, parts)
    left_out = _left_out(getattr(runtime, "place", None))
    return line + f" ({left_out})" if left_out else line


def _left_out(place) -> str:
    """What the trace lacks, said in its line: several worker groups each gather their own (group 0
    writes), and separate server ranks record no trainer."""
    if place is None:
        return ""
    missing = [f"worker group 0 of {place.groups}: the others' timelines are not kept"] if place.groups > 1 else []
    if place.has_servers:
        servers = sum(len(ranks) for ranks in place.topo.server_groups)
        missing.append(f"the {servers} server rank(s) are not traced")
    return "; ".join(missing)
