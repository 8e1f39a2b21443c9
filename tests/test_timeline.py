"""`train --trace FILE`: Chrome-trace JSON that Perfetto and chrome://tracing load (complete events,
named processes and tracks, spans that nest per track), serially and on 2 ranks with one clock;
`train --profile` and WORKSPACE/profile.json: per-layer totals per training step."""
import collections
import json
import subprocess
import sys
import time

import pytest

from checkpoint_jobs import ROOT, job_file
from mpi_jobs import mpi_env, mpiexec_command

from singa_mpi import cli, timeline
from singa_mpi.tracing import Tracer

TEST_PHASE = "\ntest_steps: 2\ntest_freq: 5\ncheckpoint_freq: 4\n"
LAYERS = ["data", "fc1", "act1", "fc2", "act2", "fc3", "loss"]  # tests/nets.py's MLP


def check_chrome_trace(trace: dict) -> list[dict]:
    """Assert the structure viewers need; returns the complete events."""
    assert isinstance(trace["traceEvents"], list)
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} == {"X", "M"}
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e), e
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)), e
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and "step" in e["args"], e
    meta = [e for e in events if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes == {pid: f"rank {pid}" for pid in {e["pid"] for e in spans}}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in spans} <= set(threads)
    assert_nested_per_track(spans)
    return spans


def assert_nested_per_track(spans: list[dict]) -> None:
    """On every (pid, tid), two spans either nest or are disjoint (in integer nanoseconds)."""
    tracks = collections.defaultdict(list)
    for e in spans:
        start = round(e["ts"] * 1000)
        tracks[(e["pid"], e["tid"])].append((start, start + round(e["dur"] * 1000), e["name"]))
    for track, intervals in tracks.items():
        open_spans: list[tuple[int, str]] = []
        for start, end, name in sorted(intervals, key=lambda s: (s[0], -s[1])):
            while open_spans and open_spans[-1][0] <= start:
                open_spans.pop()
            assert not open_spans or end <= open_spans[-1][0], \
                f"track {track}: '{name}' [{start}, {end}] overlaps '{open_spans[-1][1]}' ending at {open_spans[-1][0]}"
            open_spans.append((end, name))


def by_track(spans: list[dict], pid: int, tid: int) -> list[dict]:
    return [e for e in spans if e["pid"] == pid and e["tid"] == tid]


# ---------------------------------------------------------------- the exporter alone

def test_overlapping_requests_get_one_in_flight_track_each_and_waits_pair_in_order():
    tracer = Tracer(rank=2, record=True)
    tracer.step = 4

    def call(name, op, nbytes=0):
        tracer.end(tracer.begin(name, "comm", {"op": op, "peer": "group"}), nbytes)

    with tracer.span("train_one_batch", "step"):
        call("bucket0", "Iallreduce", 400)
        call("bucket1", "Iallreduce", 800)
        call("bridge", "Isend", 10)
        call("bridge", "Isend", 20)
        call("bucket0", "Wait(Iallreduce)")
        call("bridge", "Wait(Isend)")
        call("bucket1", "Wait(Iallreduce)")
        call("bridge", "Wait(Isend)")
        call("bucket2", "Iallreduce", 5)  # never waited for in the recording: left out
    part = timeline.rank_trace(tracer)
    trace = timeline.chrome_trace([part])
    spans = check_chrome_trace(json.loads(json.dumps(trace)))
    flights = [e for e in spans if e["cat"] == "in_flight"]
    assert sorted((e["args"]["layer"], e["args"]["bytes"]) for e in flights) == \
        [("bridge", 10), ("bridge", 20), ("bucket0", 400), ("bucket1", 800)]
    assert len({e["tid"] for e in flights}) == 4  # all four are in flight at once
    assert all(e["tid"] >= timeline.IN_FLIGHT and e["pid"] == 2 and e["args"]["step"] == 4 for e in flights)
    first, second = sorted((e for e in flights if e["args"]["layer"] == "bridge"), key=lambda e: e["ts"])
    assert first["args"]["bytes"] == 10 and first["ts"] + first["dur"] < second["ts"] + second["dur"]
    comm = by_track(spans, 2, timeline.COMM)
    assert len(comm) == 9 and {e["args"]["op"] for e in comm} >= {"Iallreduce", "Wait(Isend)"}
    assert [e["name"] for e in by_track(spans, 2, timeline.TRAINER)] == ["train_one_batch"]
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"layers", "communication", "trainer", "in flight 1", "in flight 4"} <= names


def test_restart_clock_keeps_totals_and_drops_earlier_events():
    tracer = Tracer(record=True)
    with tracer.span("setup", "comm", {"op": "allgather"}):
        pass
    tracer.restart_clock()
    with tracer.span("fc1", "forward"):
        pass
    assert [e.name for e in tracer.events] == ["fc1"] and tracer.events[0].start >= 0
    assert tracer.by_name("comm")["setup"].calls == 1
    before = tracer.snapshot()
    with tracer.span("fc1", "forward"):
        pass
    assert before[("forward", "fc1")].calls == 1 and tracer.by_name("forward")["fc1"].calls == 2


def test_start_records_from_a_barrier_on():
    """Every rank restarts its clock as it leaves the same barrier: that is what puts ranks on one clock."""
    seen = []

    class Runtime:
        tracer = Tracer(record=False)

        def barrier(self):
            seen.append((time.perf_counter(), self.tracer.record, list(self.tracer.events)))

        def allgather_object(self, value):  # one rank: its own origin
            return [value]

    runtime = Runtime()
    with runtime.tracer.span("setup", "comm", {"op": "allgather"}):
        pass
    timeline.start(runtime)
    (left, recording, _), = seen
    assert recording and runtime.tracer.origin >= left and runtime.tracer.events == []


def test_taking_rank_0s_origin_leaves_no_span_on_the_old_clock():
    """A rank on rank 0's node takes rank 0's origin after the exchange of origins; that exchange was
    recorded on the rank's own clock, so it must not stay in the timeline: with rank 0's origin later
    by more than the exchange lasted, the exchange overlapped the first step's spans on the
    communication track (seen in CI: 'stop-signal vote' overlapping 'allgather(objects)')."""
    import socket

    class Runtime:
        tracer = Tracer(record=False)

        def barrier(self):
            pass

        def allgather_object(self, value):
            with self.tracer.span("allgather(objects)", "comm", {"op": "allgather"}):
                return [(socket.gethostname(), self.tracer.origin + 0.5, "rank0s"), value]  # rank 0 left later

    runtime = Runtime()
    assert timeline.start(runtime) == "rank0s"  # the run's name for its part files: rank 0's
    with runtime.tracer.span("stop-signal vote", "comm", {"op": "Allreduce"}):
        pass
    assert [e.name for e in runtime.tracer.events] == ["stop-signal vote"]
    assert runtime.tracer.by_name("comm")["allgather(objects)"].calls == 1  # still counted in the totals


# ---------------------------------------------------------------- serial and 2-rank runs

def test_serial_trace_and_profile(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # --profile times the kernels for its prediction
    conf = job_file(tmp_path, "data", steps=10, extra=TEST_PHASE)
    workspace, path = tmp_path / "ws", tmp_path / "out" / "trace.json"
    assert cli.main(["train", conf, "--workspace", str(workspace), "--trace", str(path), "--profile"]) == 0
    printed = capsys.readouterr().out
    spans = check_chrome_trace(json.loads(path.read_text()))
    assert {e["pid"] for e in spans} == {0}
    layers = by_track(spans, 0, timeline.LAYERS)
    for layer in LAYERS:  # every training step, and the test passes at steps 0, 5, 10 (2 batches each)
        assert sum(e["name"] == f"{layer} forward" for e in layers) == 10 + 3 * 2, layer
    for layer in ["fc1", "fc2", "fc3", "loss"]:
        assert sum(e["name"] == f"{layer} backward" for e in layers) == 10, layer
    trainer = collections.Counter(e["name"] for e in by_track(spans, 0, timeline.TRAINER))
    assert trainer["train_one_batch"] == trainer["sync"] == trainer["update"] == 10
    assert trainer["test"] == 3 and trainer["checkpoint"] == 4  # steps 0, 4, 8 (checkpoint_after 0) and 10
    # the training steps 0-9, and the final test pass, after the last of them, at step 10 (as it is reported)
    assert {e["args"]["step"] for e in layers} == set(range(11))
    test_steps = {e["args"]["step"] for e in by_track(spans, 0, timeline.TRAINER) if e["name"] == "test"}
    assert test_steps == {0, 5, 10}, test_steps
    assert f"timeline {path}" in printed

    profile = json.loads((workspace / "profile.json").read_text())
    assert profile["steps"] == 10 and len(profile["ranks"]) == 1
    rows = {(r["cat"], r["name"]): r for r in profile["ranks"][0]}
    for layer in LAYERS:  # the test passes are kept apart: one forward per training step
        assert rows[("forward", layer)]["calls"] == 1.0 and rows[("forward", layer)]["seconds"] > 0
    assert rows[("step", "train_one_batch")]["calls"] == 1.0 and rows[("step", "checkpoint")]["calls"] == 0.4
    evaluation = {(r["cat"], r["name"]): r for r in profile["evaluation"][0]}
    assert evaluation[("forward", "fc1")]["calls"] == 3 * 2 and evaluation[("step", "test")]["calls"] == 3
    table = printed[printed.index("profile: per training step over 10 steps"):]
    for layer in LAYERS:
        assert any(line.split()[:2] == ["0", layer] for line in table.splitlines()), layer
    assert "rank 0: ms per step: train_one_batch" in table
    beside = table[table.index("predicted beside measured"):].splitlines()
    assert "1 worker(s)" in beside[0] and (tmp_path / "cache" / "singa_mpi" / "kernels.json").exists()
    for layer in LAYERS:  # predicted forward, measured forward (a number: the layer ran), backward pair
        cells = next(line.split() for line in beside if line.split()[:1] == [layer])
        assert len(cells) == 5 and float(cells[1]) >= 0 and float(cells[2]) > 0, cells
    step = next(line for line in beside if line.strip().startswith("step: predicted"))
    assert "predicted/measured" in step and "over 10 steps" in step


def test_profile_json_without_flags_and_no_trace_unless_asked(tmp_path, capsys):
    conf = job_file(tmp_path, "data", steps=3)
    assert cli.main(["train", conf, "--workspace", str(tmp_path / "ws")]) == 0
    printed = capsys.readouterr().out
    assert "profile:" not in printed and "timeline" not in printed
    profile = json.loads((tmp_path / "ws" / "profile.json").read_text())
    assert profile["steps"] == 3 and profile["ranks"][0]


@pytest.mark.slow
def test_two_ranks_write_one_trace_on_one_clock(tmp_path):
    conf = job_file(tmp_path, "hybrid", steps=6, extra=TEST_PHASE)
    workspace, path = tmp_path / "ws", tmp_path / "trace.json"
    command = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(workspace),
                                    "--trace", str(path), "--profile"]
    result = subprocess.run(command, cwd=ROOT, env=mpi_env(SINGA_MPI_SHM="0", XDG_CACHE_HOME=str(tmp_path / "cache")),
                            capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count(f"timeline {path}") == 1  # written once, by rank 0
    spans = check_chrome_trace(json.loads(path.read_text()))
    assert {e["pid"] for e in spans} == {0, 1}
    for rank in (0, 1):
        comm = by_track(spans, rank, timeline.COMM)
        ops = {e["args"]["op"] for e in comm}
        assert {"Allgatherv", "Iallreduce", "Wait(Iallreduce)"} <= ops, ops
        moved = [e for e in comm if e["args"]["bytes"] > 0]
        assert moved and all(e["args"]["peer"] and e["args"]["layer"] for e in moved)
        assert [e for e in spans if e["pid"] == rank and e["cat"] == "in_flight"]  # backward exchanges, buckets
        assert sum(e["name"] == "train_one_batch" for e in by_track(spans, rank, timeline.TRAINER)) == 6
    # one clock: both ranks are inside step s's blocking exchanges together, so their
    # train_one_batch spans of step s overlap (1 ms allowed for the barrier's exit skew)
    steps = {(e["pid"], e["args"]["step"]): e for e in spans if e["name"] == "train_one_batch"}
    for step in range(6):
        a, b = steps[(0, step)], steps[(1, step)]
        assert a["ts"] < b["ts"] + b["dur"] + 1000 and b["ts"] < a["ts"] + a["dur"] + 1000, (a, b)

    profile = json.loads((workspace / "profile.json").read_text())
    assert profile["steps"] == 6 and len(profile["ranks"]) == 2
    for rows in profile["ranks"]:
        comm = {r["name"]: r for r in rows if r["cat"] == "comm"}
        assert any(r["bytes"] > 0 for r in comm.values())
    assert "  rank 1: ms per step: train_one_batch" in result.stdout
    # the prediction, once, for the run's plan and sync (SINGA_MPI_SHM=0: Allreduce buckets)
    assert result.stdout.count("predicted beside measured") == 1
    assert "2 worker(s)" in result.stdout and "param sync allreduce" in result.stdout
    step = [line for line in result.stdout.splitlines() if line.strip().startswith("step: predicted")]
    assert len(step) == 1 and "over 6 steps" in step[0] and "predicted/measured" in step[0], result.stdout[-3000:]


def test_an_unwritable_trace_file_is_a_one_line_error(tmp_path, capsys):
    conf = job_file(tmp_path, "data", steps=2)
    (tmp_path / "a_file").write_text("")
    trace = tmp_path / "a_file" / "t.json"  # a folder that is a file
    with pytest.raises(SystemExit) as stop:  # refused with the other options, before the run
        cli.main(["train", conf, "--workspace", str(tmp_path / "ws"), "--trace", str(trace)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "a_file is a file, not a folder" in err, err


def finished_line(tmp_path, place) -> str:
    import types

    tracer = Tracer(rank=0)
    tracer.record = True
    with tracer.span("fc1", "layer"):
        pass
    runtime = types.SimpleNamespace(tracer=tracer, is_root=True, gather_object=lambda part: [part], place=place)
    line = timeline.finish(runtime, str(tmp_path / "t.json"))
    assert line.startswith(f"timeline {tmp_path / 't.json'}: 1 spans from 1 rank(s)")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    return line


@pytest.mark.parametrize("groups", [1, 3])
def test_the_line_says_when_the_trace_holds_one_worker_group_of_several(tmp_path, groups):
    """Downpour and Hogwild gather each group's timeline in the group; group 0 writes its own."""
    import types

    place = types.SimpleNamespace(groups=groups, has_servers=False) if groups > 1 else None  # Hogwild's groups
    line = finished_line(tmp_path, place)
    assert line.endswith("(worker group 0 of 3: the others' timelines are not kept)") == (groups == 3)


@pytest.mark.parametrize("groups", [1, 2])
def test_the_line_says_that_server_ranks_are_not_traced(tmp_path, groups):
    """Sandblaster's and Downpour's server ranks run no trainer: the trace had them silently missing."""
    import types

    topo = types.SimpleNamespace(server_groups=((3, 4),))
    line = finished_line(tmp_path, types.SimpleNamespace(groups=groups, has_servers=True, topo=topo))
    assert line.endswith("the 2 server rank(s) are not traced)"), line
    assert ("(worker group 0 of 2: the others' timelines are not kept; " in line) == (groups == 2), line
