"""What `train` leaves behind: the --trace timeline and WORKSPACE/profile.json when a run ends early,
as on a finished run, and no timeline written over a file the run reads or writes."""
from __future__ import annotations

import collections
import json
import os

import numpy as np
import pytest

from checkpoint_jobs import job_file
from singa_mpi import cli
from test_nonfinite import BAD_STEP, assert_stopped, job, store, train
from test_timeline import check_chrome_trace


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_nonfinite_stop_still_writes_the_trace_and_the_profile(tmp_path, ranks):
    """A NaN stops every rank at the same step (voted): the timeline up to it is the one most wanted."""
    trace, workspace = tmp_path / "trace.json", tmp_path / "ws"
    result = train(job(tmp_path, store(tmp_path, np.nan)), workspace, "--trace", str(trace), ranks=ranks,
                   big_stores=True)  # a store that is decoded whole is refused before training
    assert_stopped(result, workspace, BAD_STEP)
    assert result.stdout.count(f"timeline {trace}: ") == 1, result.stdout[-2000:]
    spans = check_chrome_trace(json.loads(trace.read_text()))
    batches = collections.Counter(e["pid"] for e in spans if e["name"] == "train_one_batch")
    assert batches == {rank: BAD_STEP + 1 for rank in range(ranks)}  # the bad step's batch included
    profile = json.loads((workspace / "profile.json").read_text())
    assert profile["steps"] == BAD_STEP + 1 and len(profile["ranks"]) == ranks


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_nonfinite_stop_of_an_elastic_attempt_keeps_its_profile_apart(tmp_path, monkeypatch, ranks):
    """Under `singa-mpi run --elastic` a non-finite stop (exit 5, which the supervisor restarts once) wrote
    WORKSPACE/profile.json, which the restart's replaced: it writes the attempt's own file, as a failure does."""
    from singa_mpi import run_events

    monkeypatch.setenv(run_events.ATTEMPT_VARIABLE, "2")
    workspace = tmp_path / "ws"
    result = train(job(tmp_path, store(tmp_path, np.nan)), workspace, ranks=ranks, big_stores=True)
    assert_stopped(result, workspace, BAD_STEP)
    profile = json.loads((workspace / "profile.attempt2.json").read_text())
    assert profile["steps"] == BAD_STEP + 1 and len(profile["ranks"]) == ranks
    assert not (workspace / "profile.json").exists()


@pytest.mark.parametrize("target, what", [
    ("job.conf", "is the job file"),
    ("data.h5", "is layer 'data' store_conf.path"),
    ("ws/metrics.jsonl", "is the run's metrics.jsonl"),
    ("ws/profile.json", "is the run's profile.json"),
    ("ws/checkpoint/step2.h5", "is in the workspace's checkpoint folder"),
])
def test_a_trace_over_a_file_of_the_run_is_refused_before_training(tmp_path, capsys, monkeypatch, target, what):
    """The timeline, written at the end, silently replaced the job file (or a store) with JSON."""
    monkeypatch.chdir(tmp_path)
    conf = job_file(tmp_path, "data", steps=2)
    before = {name: (tmp_path / name).read_bytes() for name in ("job.conf", "data.h5")}
    assert cli.main(["train", conf, "--workspace", "ws", "--trace", target]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--trace {target}: {what}: expected a file the run neither reads nor writes" in err
    assert before == {name: (tmp_path / name).read_bytes() for name in before}
    assert not os.path.exists(tmp_path / "ws" / "checkpoint")  # refused before the run


def test_a_trace_beside_the_run_files_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf = job_file(tmp_path, "data", steps=2)
    assert cli.main(["train", conf, "--workspace", "ws", "--trace", "ws/trace.json"]) == 0
    assert json.loads((tmp_path / "ws" / "trace.json").read_text())["traceEvents"]


def test_two_ranks_refuse_a_trace_over_the_job_file_in_one_line(tmp_path):
    conf = job_file(tmp_path, "data", steps=2)
    before = open(conf, "rb").read()
    result = train(conf, tmp_path / "ws", "--trace", conf, ranks=2)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count(f"--trace {conf}: is the job file") == 1, result.stderr[-2000:]
    assert open(conf, "rb").read() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, a file system that takes no new file")
def test_a_trace_folder_that_takes_no_file_is_refused_before_training(tmp_path, capsys):
    """os.access passes /proc (and, for root, any read-only file system): the trace failed after the training."""
    conf = job_file(tmp_path, "data", steps=2)
    assert cli.main(["train", conf, "--workspace", str(tmp_path / "ws"), "--trace", "/proc/singa-mpi/t.json"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trace /proc/singa-mpi/t.json: cannot write a file in /proc: " in err, err
    assert not os.path.exists(tmp_path / "ws" / "checkpoint")


def _longest_trace_name(folder) -> str:
    """A --trace file name as long as ``folder``'s file system holds: its temporary copy, and the ranks'
    part files beside it, are not."""
    return "t" * (os.pathconf(folder, "PC_NAME_MAX") - len(".json")) + ".json"


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_trace_name_too_long_for_the_files_beside_it_is_refused_before_training(tmp_path, ranks):
    """A --trace name of 255 characters passed every check, the run trained to its end, then failed
    writing the timeline's temporary copy ('could not write the timeline: File name too long', exit 3,
    under MPI an Abort line too)."""
    conf = job_file(tmp_path, "data", steps=2)
    trace = str(tmp_path / _longest_trace_name(tmp_path))
    result = train(conf, tmp_path / "ws", "--trace", trace, ranks=ranks)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 3 and len(lines) == 1, result.stderr[-2000:]
    assert f"--trace {trace}: " in lines[0] and "File name too long: expected a shorter name" in lines[0], lines[0]
    assert not os.path.exists(tmp_path / "ws" / "checkpoint")  # refused before the run
    assert set(os.listdir(tmp_path)) <= {"job.conf", "data.h5", "ws"}  # and the probe left nothing


def _checkpoints_fail_from_step_2(monkeypatch) -> None:
    """The run's checkpoints from step 2 on fail as a disk gone away would (a DataError)."""
    from singa_mpi.errors import DataError
    from singa_mpi.trainer import Trainer

    def failing(trainer, step):
        if step >= 2:
            raise DataError("the disk went away")
        return keep(trainer, step)

    keep = Trainer.save_checkpoint
    monkeypatch.setattr(Trainer, "save_checkpoint", failing)


def test_a_serial_run_that_fails_still_writes_the_trace_and_the_profile(tmp_path, capsys, monkeypatch):
    """One rank has nothing to gather: the timeline and the profile up to the failure were lost with it."""
    from singa_mpi.errors import DataError

    _checkpoints_fail_from_step_2(monkeypatch)
    conf = job_file(tmp_path, "data", steps=6, extra="\ncheckpoint_freq: 2\n")
    trace, workspace = tmp_path / "trace.json", tmp_path / "ws"
    assert cli.main(["train", conf, "--workspace", str(workspace), "--trace", str(trace)]) == DataError.exit_code
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "the disk went away" in captured.err, captured.err
    assert f"timeline {trace}: " in captured.out
    spans = check_chrome_trace(json.loads(trace.read_text()))
    assert sum(e["name"] == "train_one_batch" for e in spans) == 2
    assert json.loads((workspace / "profile.json").read_text())["steps"] == 2


def test_a_serial_run_that_fails_under_elastic_keeps_its_profile_apart(tmp_path, capsys, monkeypatch):
    """`singa-mpi run -n 1 --elastic`: the one rank's failure writes its attempt's own profile, which the
    restart's WORKSPACE/profile.json does not replace (only the MPI case had a test)."""
    from singa_mpi import run_events
    from singa_mpi.errors import DataError

    _checkpoints_fail_from_step_2(monkeypatch)
    monkeypatch.setenv(run_events.ATTEMPT_VARIABLE, "3")
    conf = job_file(tmp_path, "data", steps=6, extra="\ncheckpoint_freq: 2\n")
    workspace = tmp_path / "ws"
    assert cli.main(["train", conf, "--workspace", str(workspace)]) == DataError.exit_code
    assert "the disk went away" in capsys.readouterr().err
    assert json.loads((workspace / "profile.attempt3.json").read_text())["steps"] == 2
    assert not (workspace / "profile.json").exists()


FAIL = '''\
"""Test plugin: a pass-through layer that raises a DataError at its fourth training forward on world rank 1."""
import os

from singa_mpi.errors import DataError
from singa_mpi.layers import LAYERS, Layer


@LAYERS.register("kFailOnRank1")
class Fail(Layer):
    def setup(self, src_shapes):
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        self.fails, self.calls = rank == "1", 0
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        self.calls += int(train)
        if self.fails and self.calls == 4:
            raise DataError("the store's disk went away")
        return inputs[0]

    def backward(self, grad, need):
        return [grad if need[0] else None]
'''


def traced_failing_run(tmp_path, plugin: str, traced: bool = True, **env: str):
    """``mpiexec -n 2`` of the test job with a plugin layer (``plugin``: its source) after the data, traced
    to tmp_path/out/trace.json (unless not ``traced``), with the variables ``env``; returns (the finished
    process, the trace's path)."""
    import subprocess
    import sys

    from mpi_jobs import mpi_env, mpiexec_command

    (tmp_path / "fail.py").write_text(plugin)
    conf = job_file(tmp_path, "data", steps=8)
    text = open(conf).read().replace('layer { name: "fc1" type: kInnerProduct srclayers: "data"',
                                     'layer { name: "fail" type: kUserLayer user_type: "kFailOnRank1" srclayers: '
                                     '"data" }\nlayer { name: "fc1" type: kInnerProduct srclayers: "fail"')
    conf_path = tmp_path / "fail.conf"
    conf_path.write_text(f'plugin: "{tmp_path}/fail.py"\n' + text)
    trace = tmp_path / "out" / "trace.json"
    cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", str(conf_path), "--workspace",
                                str(tmp_path / "ws")] + (["--trace", str(trace)] if traced else [])
    return subprocess.run(cmd, env=mpi_env(**env), capture_output=True, text=True, timeout=240), trace


@pytest.mark.slow
def test_a_rank_that_fails_under_mpi_keeps_every_rank_s_timeline(tmp_path):
    """One rank's failure aborts the job: every rank's timeline, kept in memory to be gathered at the
    end, was lost with it.  Each rank now writes its spans step by step to a part file, and the failing
    rank writes the trace from them: the others up to their last finished step, its own up to the
    failure; no part file is left."""
    (tmp_path / "out").mkdir()
    stale = tmp_path / "out" / "trace.rank3.part"  # left by an older run killed outright: never merged
    stale.write_text('{"run": "older", "rank": 3, "origin_unix": 0}\n["fc1","forward",0,1,0,0,null]\n')
    result, trace = traced_failing_run(tmp_path, FAIL)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "the store's disk went away" in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.count(f"timeline {trace}: ") == 1, result.stdout[-2000:]
    assert ("(up to the failure: rank 1's to its failure, the others' to their last written step; ranks 0 1; "
            "the job is aborted)") in result.stdout, result.stdout[-2000:]
    spans = check_chrome_trace(json.loads(trace.read_text()))
    batches = collections.Counter(e["pid"] for e in spans if e["name"] == "train_one_batch")
    # rank 1 failed in its fourth step (its span included, from memory); rank 0 finished three and waited in
    # the fourth: its part holds the first and as many more as its writes' pauses let in (timeline_parts)
    assert batches[1] == 4 and 1 <= batches[0] <= 3 and set(batches) == {0, 1}, batches
    assert not list((tmp_path / "out").glob("*.part"))
    # the profile too (it was lost): rank 1's totals to its failure, rank 0's from the spans of its part
    profile = json.loads((tmp_path / "ws" / "profile.json").read_text())
    assert profile["steps"] == 4 and profile["missing"] == [] and all(profile["ranks"]), profile
    steps = [next(row["calls"] for row in rows if row["name"] == "train_one_batch") for rows in profile["ranks"]]
    assert steps == [1.0, 1.0]  # per step: each rank's own steps
    assert result.stdout.count("profile ") == 1 and (
        f"profile {tmp_path / 'ws' / 'profile.json'}: rank 1 up to its failure, ranks 0 up to their last written "
        f"step (their --trace parts)\n") in result.stdout, result.stdout[-2000:]


@pytest.mark.slow
def test_a_rank_that_fails_under_mpi_untraced_keeps_its_own_profile_and_says_so(tmp_path):
    """Without --trace there are no parts: the failing rank's own totals, where nothing was written."""
    result, _ = traced_failing_run(tmp_path, FAIL, traced=False)
    assert result.returncode == 3, result.stderr[-3000:]
    profile = json.loads((tmp_path / "ws" / "profile.json").read_text())
    assert profile["steps"] == 4 and profile["missing"] == [0] and profile["ranks"][0] == [] and profile["ranks"][1]
    assert (f"profile {tmp_path / 'ws' / 'profile.json'}: rank 1 up to its failure alone: the other ranks' totals "
            f"are lost with the aborted job (--trace keeps each rank's up to its last written step)\n") \
        in result.stdout, result.stdout[-2000:]


@pytest.mark.slow
def test_a_failed_attempt_of_an_elastic_run_keeps_its_profile_apart_and_says_where(tmp_path):
    """Under `singa-mpi run --elastic` (which tells the ranks their attempt) the failing rank wrote
    WORKSPACE/profile.json, which the healed run's replaced: it now writes the attempt's own file."""
    from singa_mpi import run_events

    result, _ = traced_failing_run(tmp_path, FAIL, **{run_events.ATTEMPT_VARIABLE: "2"})
    assert result.returncode == 3, result.stderr[-3000:]
    kept = tmp_path / "ws" / "profile.attempt2.json"
    assert json.loads(kept.read_text())["steps"] == 4 and not (tmp_path / "ws" / "profile.json").exists()
    assert f"profile {kept}: rank 1 up to its failure, ranks 0 up to their last written step" in result.stdout, \
        result.stdout[-2000:]


@pytest.mark.slow
def test_a_rank_killed_outright_under_mpi_leaves_every_rank_s_timeline(tmp_path):
    """A rank SIGKILLed (the out-of-memory killer) leaves no rank to merge the ranks' part files: the
    guardian process that names the vanished rank writes the trace from them, each rank up to its last
    written step, and removes them; and the profile from the same parts (it left none)."""
    import time

    result, trace = traced_failing_run(tmp_path, FAIL.replace('raise DataError("the store\'s disk went away")',
                                                              "os.kill(os.getpid(), 9)"))
    assert result.returncode != 0 and "rank 1 (pid " in result.stderr and " vanished without a word" in \
        result.stderr, result.stderr[-3000:]
    deadline = time.monotonic() + 30  # the guardian outlives the launcher: it writes once it named the rank
    while time.monotonic() < deadline and (not trace.exists() or list(trace.parent.glob("*.part"))):
        time.sleep(0.1)
    spans = check_chrome_trace(json.loads(trace.read_text()))
    batches = collections.Counter(e["pid"] for e in spans if e["name"] == "train_one_batch")
    # each rank's part up to its last written step: rank 1 died in its fourth, rank 0 waited in its fourth
    assert set(batches) == {0, 1} and all(1 <= n <= 3 for n in batches.values()), batches
    assert not list(trace.parent.glob("*.part"))
    profile = json.loads((tmp_path / "ws" / "profile.json").read_text())  # written before the trace
    assert profile["missing"] == [] and all(profile["ranks"]) and 1 <= profile["steps"] <= 3, profile
    steps = [next(row["calls"] for row in rows if row["name"] == "train_one_batch") for rows in profile["ranks"]]
    assert steps == [1.0, 1.0]  # per step: each rank's own steps
