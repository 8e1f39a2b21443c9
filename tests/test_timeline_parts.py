"""Each rank's part of a --trace timeline, written as the run goes (singa_mpi.timeline_parts): what a
failed MPI run's trace is merged from.  The merge itself, under mpiexec, is in
tests/launcher/test_train_outputs.py."""
from __future__ import annotations

import json

import pytest

from singa_mpi import timeline, timeline_parts
from singa_mpi.tracing import Tracer


@pytest.fixture(autouse=True)
def every_flush_writes(monkeypatch):
    """No pause between writes here (but in test_writes_pause_for_49_times_their_own_duration)."""
    monkeypatch.setattr(timeline_parts.PartWriter, "PAUSE", 0)


def traced(rank: int, steps: int) -> Tracer:
    tracer = Tracer(rank=rank, record=True)
    for step in range(steps):
        tracer.step = step
        with tracer.span("train_one_batch", "step"):
            with tracer.span("fc1", "forward"):
                pass
            tracer.end(tracer.begin("fc1", "comm", {"op": "Allreduce", "peer": "group"}), 64)
    return tracer


def test_a_part_holds_every_span_flushed_and_reads_back_as_the_tracer_recorded_it(tmp_path):
    trace = str(tmp_path / "out" / "trace.json")  # a folder the trace's writer makes at the end: made now
    tracer = traced(2, 2)
    writer = timeline_parts.PartWriter(trace, tracer, "run1")
    writer.flush()
    writer.flush()  # nothing new: nothing written twice
    (header, spans), = timeline_parts.read_parts(trace, "run1")
    assert writer.path == str(tmp_path / "out" / "trace.rank2.part") and header["rank"] == 2
    assert spans == tracer.events  # name, category, times, bytes, step and args
    part = timeline.part_of(2, spans, header["origin_unix"])
    assert part["events"] == timeline.rank_trace(tracer)["events"]  # the same Chrome events as gathered


def test_spans_are_appended_step_by_step_and_a_cut_last_line_is_dropped(tmp_path):
    trace = str(tmp_path / "trace.json")
    tracer = traced(0, 1)
    writer = timeline_parts.PartWriter(trace, tracer, "r")
    writer.flush()
    with tracer.span("train_one_batch", "step"):
        pass
    writer.flush()
    with open(writer.path, "a") as handle:  # a rank still writing as the part is read
        handle.write('["fc2","forw')
    (_, spans), = timeline_parts.read_parts(trace, "r")
    assert [s.name for s in spans] == [s.name for s in tracer.events] and len(spans) == 4


def test_only_this_run_s_parts_are_read_and_stale_ones_are_removed(tmp_path):
    trace = str(tmp_path / "t.json")
    timeline_parts.PartWriter(trace, traced(0, 1), "now").flush()
    timeline_parts.PartWriter(trace, traced(1, 1), "older").flush()
    (tmp_path / "t.rankx.part").write_text("not a part")  # not a rank's name: never touched
    (tmp_path / "t.rank5.part").write_text("not json\n")
    assert [h["rank"] for h, _ in timeline_parts.read_parts(trace, "now")] == [0]
    timeline_parts.remove_parts(trace, "now")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.rank1.part", "t.rank5.part", "t.rankx.part"]
    timeline_parts.remove_stale(trace)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.rankx.part"]


def test_a_tracer_that_forgot_its_events_starts_the_count_again(tmp_path):
    trace = str(tmp_path / "t.json")
    tracer = traced(0, 2)
    writer = timeline_parts.PartWriter(trace, tracer, "r")
    writer.flush()
    tracer.reset()
    with tracer.span("after", "step"):
        pass
    writer.flush()
    (_, spans), = timeline_parts.read_parts(trace, "r")
    assert [s.name for s in spans][-1] == "after" and len(spans) == 7


def test_a_full_disk_stops_the_part_with_one_note_and_never_the_run(tmp_path):
    trace = str(tmp_path / "t.json")
    tracer = traced(0, 1)
    writer = timeline_parts.PartWriter(trace, tracer, "r")
    writer.file.close()
    writer.file = open("/dev/full", "w")  # every write: ENOSPC
    writer.flush()
    assert writer.file is None and writer.note == (f"note: this rank's part of the timeline stopped being "
                                                   f"written: {writer.path}: No space left on device")
    writer.flush()  # stopped: no second attempt, no error
    (tmp_path / "a_file").write_text("")
    unwritable = timeline_parts.PartWriter(str(tmp_path / "a_file" / "t.json"), tracer, "r")
    assert unwritable.file is None and unwritable.note.startswith("note: this rank's part of the timeline ")
    assert json.loads(open(writer.path).readline())["run"] == "r"  # what was written before stays readable


def test_writes_pause_for_49_times_their_own_duration(tmp_path, monkeypatch):
    """At most 2% of a rank's time goes to its part: a flush soon after a write writes nothing (its spans
    wait for the next one)."""
    monkeypatch.setattr(timeline_parts.PartWriter, "PAUSE", 49)
    trace = str(tmp_path / "t.json")
    tracer = traced(0, 1)
    writer = timeline_parts.PartWriter(trace, tracer, "r")
    clock = iter([10.0, 10.0, 10.001,  # a write that took 1 ms ...
                  10.040,  # ... 39 ms later (before 10.001 + 0.049): nothing written
                  10.050, 10.050, 10.051])  # 50 ms later: written
    monkeypatch.setattr(timeline_parts, "_clock", lambda: next(clock))
    writer.flush()
    with tracer.span("train_one_batch", "step"):
        pass
    writer.flush()
    assert writer.written == 3
    writer.flush()
    assert writer.written == 4
    (_, spans), = timeline_parts.read_parts(trace, "r")
    assert len(spans) == 4
