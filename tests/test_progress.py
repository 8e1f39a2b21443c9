"""Operator experience: progress lines (step N/total, ETA, the interval's communication share), the live
bar, the end-of-run summary, and safe workspaces (refusal, --overwrite, elapsed across resumes, a
`test` that appends nothing to the training's record)."""
import json
import os
import re
import subprocess
import sys
import types

import h5py
import pytest

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.errors import ConfigError
from singa_mpi import progress
from singa_mpi.progress import format_seconds, summary_lines
from singa_mpi.trainer import Trainer
from mpi_jobs import mpi_env, mpiexec_command
from report_jobs import ROOT, job_file, metrics, train

TEST_PHASE = "test_steps: 2 test_freq: 3\n"
DURATION = r"(?:\d+\.\ds|\d+m\d\ds|\d+h\d\dm)"
LINE = re.compile(rf"^step +(\d+)/(\d+)  (train|test )  ((?:\w+ -?\d+\.\d{{4}}  )+)(?:([\d,]+) samples/s  )?"
                  rf"(?:comm (\d+)%  )?elapsed ({DURATION})(?:  ETA ({DURATION}))?$")


def cli(args, nranks=0, expect=0, timeout=300):
    prefix = mpiexec_command(nranks) if nranks else []
    result = subprocess.run(prefix + [sys.executable, "-m", "singa_mpi", *args], cwd=ROOT, env=mpi_env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def progress_lines(out):
    return [m for m in map(LINE.match, out.splitlines()) if m]


def summary_block(out):
    lines = out.splitlines()
    start = lines.index("run summary:")
    block = {}
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        key, value = re.match(r"^  (\S+(?: \S+)?)\s{2,}(.*)$", line).groups()
        block[key] = value
    return block


# ------------------------------------------------------------------ progress lines

def test_progress_lines_show_step_of_total_rate_elapsed_and_eta(tmp_path, capsys):
    assert train(job_file(tmp_path, steps=6, extra=TEST_PHASE), tmp_path / "ws") == 0
    out = capsys.readouterr().out
    found = progress_lines(out)
    entries = metrics(tmp_path / "ws")
    assert len(found) == len(entries) == 6 + 3  # every train step, tests at 0 and 3 and after the last step
    for line, entry in zip(found, entries):
        step, total, phase, values, rate, comm, elapsed, eta = line.groups()
        assert (int(step), int(total), phase.strip()) == (entry["step"], 6, entry["phase"])
        assert f"loss {entry['loss']:.4f}" in values and f"accuracy {entry['accuracy']:.4f}" in values
        assert (rate is not None) == (phase == "train") and comm is None  # one process: no communication
        assert elapsed == format_seconds(entry["elapsed"])
        done = int(step) + (phase == "train")  # a train line comes after its step
        # no ETA until two steps after the first are timed (the first carries start-up and step 0's test)
        assert (eta is not None) == (3 <= done < 6), line.group(0)


def test_eta_is_the_steps_left_at_the_pace_since_the_first_step():
    """The pace is timed from the end of this run's first step: a 40 s job once showed "ETA 5h28m" on its
    first lines, its step 0 carrying the start-up, the first batches and the step-0 test."""
    fake = types.SimpleNamespace(train_steps=100, start_step=20, start_time=900.0, pace_mark=(1000.0, 21))
    entry = {"step": 30, "phase": "train", "elapsed": 65.0, "samples_per_s": 1234.4}
    line = Trainer.progress_line(fake, entry, {"loss": 0.5}, now=1020.0)  # 10 steps in 20 s, 69 to go
    assert line == "step  30/100  train  loss 0.5000  1,234 samples/s  elapsed 1m05s  ETA 2m18s"
    test = {"step": 130, "phase": "test", "elapsed": 3.0}  # `singa-mpi test` of a longer run: no N/total
    assert Trainer.progress_line(fake, test, {}, now=1020.0) == "step 130  test   elapsed 3.0s"
    first = {"step": 21, "phase": "train", "elapsed": 40.0}  # one step after the first (20): no pace yet
    assert Trainer.progress_line(fake, first, {}, now=1002.0) == "step  21/100  train  elapsed 40.0s"
    fake.pace_mark = None  # before the first step ends (a step-0 test line)
    assert "ETA" not in Trainer.progress_line(fake, dict(first, phase="test"), {}, now=1002.0)


def test_eta_needs_two_steps_after_the_first():
    assert progress.eta(steps=0, seconds=5.0, left=10) is None
    assert progress.eta(steps=1, seconds=5.0, left=10) is None
    assert progress.eta(steps=2, seconds=5.0, left=10) == 25.0
    assert progress.eta(steps=4, seconds=2.0, left=0) == 0.0


def test_format_seconds():
    assert [format_seconds(s) for s in (0.04, 3.24, 59.9, 245, 7620)] == ["0.0s", "3.2s", "59.9s", "4m05s", "2h07m"]


@pytest.mark.slow
def test_comm_share_is_the_share_of_each_interval_at_3_ranks(tmp_path):
    """Each line's share: seconds inside communication calls since the previous line over the wall time
    since then (the first test line once read 146%, comm accumulated since MPI_Init over the trainer's clock)."""
    conf = job_file(tmp_path, steps=30, batch=7, scheme="hybrid", nranks=3, extra=TEST_PHASE)
    result = cli(["train", conf, "--workspace", str(tmp_path / "ws")], nranks=3)
    entries = metrics(tmp_path / "ws")
    assert len(entries) == 30 + 11 and all(0 <= e["comm_share"] <= 1 for e in entries), entries
    found = progress_lines(result.stdout)
    assert len(found) == len(entries)  # printed by rank 0 only
    assert [int(m.group(6)) for m in found] == [round(100 * e["comm_share"]) for e in entries]
    block = summary_block(result.stdout)
    share, low, high = map(int, re.match(r"(\d+)% of wall time on rank 0 \(ranks: (\d+)-(\d+)%\)",
                                         block["communication"]).groups())
    assert 0 <= low <= share <= high <= 100
    assert re.match(r"[012]: [\d.]+ ms/step outside communication, [\d.]+ ms/step in all "
                    r"\(fastest: rank [012], [\d.]+ ms\)", block["slowest rank"]), block


# ------------------------------------------------------------------ the live bar

def test_a_live_bar_on_a_terminal_and_plain_lines_in_logs(tmp_path):
    pytest.importorskip("tqdm")
    import fcntl
    import pty
    import struct
    import termios

    conf = job_file(tmp_path, steps=6)
    piped = cli(["train", conf, "--workspace", str(tmp_path / "piped")])
    assert "step/s" not in piped.stdout and "\r" not in piped.stdout  # a log: lines only
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's size
    proc = subprocess.Popen([sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(tmp_path / "tty")],
                            cwd=ROOT, env=mpi_env(), stdout=follower, stderr=follower, stdin=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 0
    shown = b"".join(chunks).decode(errors="replace")
    assert "step/s" in shown  # tqdm's bar, counting steps
    plain = [line.rstrip("\r").split("\r")[-1] for line in shown.split("\n")]  # what stays on the screen
    assert len(progress_lines("\n".join(plain))) == 6  # every progress line, whole, above the bar
    assert "run summary:" in shown


# ------------------------------------------------------------------ the summary

def test_a_run_ends_with_a_summary_block(tmp_path, capsys):
    assert train(job_file(tmp_path, steps=6, extra=TEST_PHASE), tmp_path / "ws") == 0
    block = summary_block(capsys.readouterr().out)
    tests = [e for e in metrics(tmp_path / "ws") if e["phase"] == "test"]
    best = max(tests, key=lambda e: e["accuracy"])
    assert block["steps"] == "6/6 (done; 6 in this run)"
    assert re.fullmatch(DURATION, block["wall time"])
    assert float(block["samples/s"].split()[0].replace(",", "")) > 0
    assert block["test"].startswith(f"final loss {tests[-1]['loss']:.4f} accuracy {tests[-1]['accuracy']:.4f} (step 6)")
    assert f"best accuracy {best['accuracy']:.4f} (step {best['step']})" in block["test"]
    assert block["checkpoint"] == checkpoint.checkpoint_path(str(tmp_path / "ws"), 6)
    assert "communication" not in block and "slowest rank" not in block  # one process


def test_summary_lines_name_the_slowest_rank_outside_communication():
    run = {"start": 10, "end": 30, "total": 40, "wall": 4.0, "elapsed": 65.0, "samples": 640, "stopped": True,
           "test": [{"step": 10, "loss": 0.5, "accuracy": 0.7}, {"step": 20, "loss": 0.4, "accuracy": 0.6}],
           "checkpoint": "ws/checkpoint/step30.h5"}
    ranks = [{"rank": 0, "wall": 4.0, "comm": 1.0, "steps": 20, "step": 2.0, "step_comm": 0.8},   # 60 ms computing
             {"rank": 1, "wall": 4.0, "comm": 0.4, "steps": 20, "step": 2.0, "step_comm": 0.2},   # 90 ms
             {"rank": 2, "wall": 4.0, "comm": 2.0, "steps": 20, "step": 2.0, "step_comm": 1.9}]   # 5 ms
    assert summary_lines(run, ranks) == [
        "run summary:",
        "  steps           30/40 (stopped on a signal; 20 in this run, resumed from step 10)",
        "  wall time       4.0s (1m05s since step 0)",
        "  samples/s       160 (mean over this run's wall time)",
        "  test            final loss 0.4000 accuracy 0.6000 (step 20); best accuracy 0.7000 (step 10), "
        "best loss 0.4000 (step 20)",
        "  checkpoint      ws/checkpoint/step30.h5",
        "  communication   25% of wall time on rank 0 (ranks: 10-50%)",
        "  slowest rank    1: 90.0 ms/step outside communication, 100.0 ms/step in all (fastest: rank 2, 5.0 ms)"]


# ------------------------------------------------------------------ safe workspaces

def test_training_into_a_workspace_with_checkpoints_refuses(tmp_path):
    conf = job_file(tmp_path, steps=4)
    ws = tmp_path / "ws"
    assert train(conf, ws) == 0
    before = {p: p.stat().st_mtime_ns for p in ws.rglob("*")}
    for nranks in (0, 2):  # serially, and under mpiexec in phase 1: one line, no abort
        result = cli(["train", conf, "--workspace", str(ws)], nranks=nranks, expect=2)
        assert result.stderr.splitlines() == [
            f"singa-mpi: error: {ws} holds another run's checkpoints (newest {ws}/checkpoint/step4.h5): expected "
            f"--resume to continue that run, or --overwrite to move it to {ws}/previous-<time>/"], result.stderr
        assert result.stdout == ""
    assert {p: p.stat().st_mtime_ns for p in ws.rglob("*")} == before  # nothing touched
    with pytest.raises(ConfigError, match="--resume and --overwrite together"):
        train(conf, ws, resume=True, overwrite=True)


def test_overwrite_moves_the_previous_run_aside(tmp_path, capsys):
    conf = job_file(tmp_path, steps=4)
    ws = tmp_path / "ws"
    assert train(conf, ws) == 0
    old_metrics = (ws / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert train(conf, ws, overwrite=True, steps=2) == 0
    out = capsys.readouterr().out
    (previous,) = ws.glob("previous-*")
    assert re.fullmatch(r"previous-\d{8}-\d{6}", previous.name)
    assert out.splitlines()[0] == f"--overwrite: moved the previous run (checkpoint, metrics.jsonl) to {previous}"
    assert (previous / "metrics.jsonl").read_text() == old_metrics
    assert [step for step, _ in checkpoint.listed(str(previous))] == [4]
    assert [step for step, _ in checkpoint.listed(str(ws))] == [2]
    assert [m["step"] for m in metrics(ws) if m["phase"] == "train"] == [0, 1]


def test_elapsed_goes_on_across_a_resume(tmp_path, capsys):
    conf = job_file(tmp_path, steps=8)
    ws = tmp_path / "ws"
    assert train(conf, ws, steps=4) == 0
    first = metrics(ws)
    saved = checkpoint.read(checkpoint.checkpoint_path(str(ws), 4))
    at_save = round(saved.elapsed, 3)  # metrics.jsonl rounds to ms; rounding keeps the order
    assert at_save >= first[-1]["elapsed"] > 0
    capsys.readouterr()
    assert train(conf, ws, resume=True) == 0
    block = summary_block(capsys.readouterr().out)
    resumed = metrics(ws)[len(first):]
    assert [m["step"] for m in resumed] == [4, 5, 6, 7]
    assert all(m["elapsed"] >= at_save for m in resumed)
    assert [m["elapsed"] for m in metrics(ws)] == sorted(m["elapsed"] for m in metrics(ws))
    assert block["steps"] == "8/8 (done; 4 in this run, resumed from step 4)"
    assert block["wall time"].endswith(" since step 0)")
    final = checkpoint.read(checkpoint.checkpoint_path(str(ws), 8))
    assert round(final.elapsed, 3) >= resumed[-1]["elapsed"]


def test_a_checkpoint_without_elapsed_reads_as_zero(tmp_path):
    conf = job_file(tmp_path, steps=2)
    assert train(conf, tmp_path / "ws") == 0
    path = checkpoint.checkpoint_path(str(tmp_path / "ws"), 2)
    assert checkpoint.read(path).elapsed > 0
    from checkpoint_jobs import write_format_2

    write_format_2(path, checkpoint.read(path))  # as written before the attribute existed (format 2)
    with h5py.File(path, "r+") as f:
        del f.attrs["elapsed"]
    assert checkpoint.read(path).elapsed == 0.0


def test_test_names_its_checkpoint_and_leaves_metrics_jsonl_alone(tmp_path, capsys):
    from singa_mpi.test_command import run_test

    conf = job_file(tmp_path, steps=4, extra=TEST_PHASE)
    ws = tmp_path / "ws"
    assert train(conf, ws) == 0
    record = (ws / "metrics.jsonl").read_text()
    chosen = checkpoint.checkpoint_path(str(ws), 4)
    capsys.readouterr()
    assert run_test(conf, lambda cfg: str(ws), checkpoints=[chosen]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"testing {chosen} (step 4)"
    assert (ws / "metrics.jsonl").read_text() == record
    (entry,) = [json.loads(line) for line in (ws / "test_results.jsonl").read_text().splitlines()]
    assert entry["checkpoint"] == chosen and entry["step"] == 4 and entry["phase"] == "test"
    assert {"loss", "accuracy"} <= set(entry)


def test_summary_lines_give_each_ranks_peak_memory():
    from singa_mpi.progress import format_bytes, peak_rss

    run = {"start": 0, "end": 10, "total": 10, "wall": 2.0, "elapsed": 2.0, "samples": 640}
    ranks = [{"rank": r, "wall": 2.0, "comm": 0.5, "steps": 10, "step": 1.8, "step_comm": 0.4, "rss": rss}
             for r, rss in enumerate([300 * 2**20, 280 * 2**20])]
    assert "  peak memory     300.0 MiB resident on rank 0 (ranks: 280.0 MiB-300.0 MiB)" in summary_lines(run, ranks)
    assert format_bytes(512) == "512 B" and format_bytes(3 * 2**30) == "3.0 GiB"
    assert peak_rss() > 10 * 2**20  # this Python process, numpy loaded


# ------------------------------------------------------------------ the communication table

TABLE_ROWS = [  # per worker: label -> (calls, bytes, seconds) over 20 steps, as WorkerRuntime.measured
    {"concate(split(act1))": (40, 20 * 2**20, 0.2), "shm(gradients)": (20, 0, 0.05), "metrics": (20, 0, 0.1),
     "allgather(objects)": (3, 0, 0.23), "stop-signal vote": (20, 0, 0.1), "partition_dim: auto": (1, 0, 0.01),
     "communicators": (4, 0, 0.3), "barrier": (2, 0, 0.0), "gather(objects)": (2, 0, 0.01),
     "shared memory": (2, 0, 0.02)},
    {"concate(split(act1))": (40, 20 * 2**20, 0.3), "shm(gradients)": (20, 0, 0.08), "metrics": (20, 0, 0.1),
     "stop-signal vote": (20, 0, 0.04)},
]


def test_the_communication_table_shows_what_a_user_can_act_on():
    """Connection layers, the parameter sync and the metrics' reduction (disp_freq); not the run's
    bookkeeping (the stop-signal vote, object exchanges, communicator set-up, `partition_dim: auto`'s
    choice for a job without auto), which --debug adds."""
    table = progress.communication_table(TABLE_ROWS, 20).splitlines()
    assert table[0] == "communication per step over 20 steps (per worker: MiB sent+received / ms):"
    assert [line.split()[0] for line in table[2:-1]] == ["concate(split(act1))", "metrics", "shm(gradients)"]
    assert table[2].split() == ["concate(split(act1))", "1.00", "/", "10.00", "1.00", "/", "15.00"]
    assert table[-1] == "  (7 rows of the run's own bookkeeping not shown: --debug shows them)"
    for internal in ("stop-signal vote", "allgather(objects)", "partition_dim: auto", "communicators"):
        assert internal not in "\n".join(table)
    everything = progress.communication_table(TABLE_ROWS, 20, debug=True).splitlines()
    assert len(everything) == 2 + 10 and "not shown" not in everything[-1]
    assert "  stop-signal vote" in "\n".join(everything) and "  partition_dim: auto" in "\n".join(everything)
    vote = next(line for line in everything if line.startswith("  stop-signal vote"))
    assert vote.split()[2:] == ["0.00", "/", "5.00", "0.00", "/", "2.00"]


def test_a_row_a_worker_did_not_use_is_a_dash():
    table = progress.communication_table(TABLE_ROWS, 20, debug=True).splitlines()
    vote = next(line for line in table if line.strip().startswith("allgather(objects)"))
    assert vote.split()[-1] == "-"


def test_a_pipelined_run_reports_each_rank_s_idle_share_beside_the_bubble():
    from singa_mpi.progress import summary_lines

    run = {"start": 0, "end": 10, "total": 10, "wall": 2.0, "elapsed": 2.0, "samples": 640,
           "pipeline": ("1f1b", 4, 2, 0.2)}
    ranks = [{"rank": 0, "wall": 2.0, "comm": 0.5, "steps": 10, "step": 1.0, "step_comm": 0.25},
             {"rank": 1, "wall": 2.0, "comm": 0.9, "steps": 10, "step": 1.0, "step_comm": 0.4}]
    line = summary_lines(run, ranks)[-1]
    assert line == ("  pipeline        1f1b, 4 micro-batches, 2 stages: idle 25% of step time on rank 0 "
                    "(ranks: 25%, 40%; the bubble of its timeline with equal slots: 20%)")
    assert not any("pipeline" in text for text in summary_lines({**run, "pipeline": None}, ranks))
