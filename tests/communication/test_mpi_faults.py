"""Faults at the edges of an MPI run, and what the job says about them.

* a rank killed (SIGKILL) at n = 2, 3, 4, in training or while the root writes a checkpoint: the job
  ends within 30 s and one line names the rank that vanished (rank, pid, host, step, activity);
* a rank stopped (SIGSTOP) in its first second, or in training: the ``--stall-timeout`` watchdog
  fires and names the stopped rank, not only the one waiting;
* ranks started with different jobs, or another ``--seed``, or resuming from different checkpoints,
  or reading different data files: the agreement message, exit 2;
* SIGTERM twice 50 ms apart: one checkpoint, exit 75; SIGTERM while the job sets up: one line,
  exit 75, nothing written.

The MPI tests launch real ``mpiexec -n N python -m singa_mpi train`` processes with bounded waits;
the pure parts of :mod:`singa_mpi.communication.liveness` are tested in one process first.
"""
import contextlib
import glob
import os
import re
import signal
import subprocess
import sys
import time
import types

import nets
import pytest
from mpi_jobs import finish, launcher, mpi_env, mpiexec_command, rank_pids, wait_for_progress

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.communication import guardian, liveness
from singa_mpi.stop_signals import STOPPED_BEFORE_TRAINING
from singa_mpi.launcher.vote import first_disagreement

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ------------------------------------------------------------------ liveness, in one process

def test_a_status_record_reads_back_what_was_published(tmp_path):
    record = liveness.StatusRecord(str(tmp_path / "launch"), rank=2, size=4)
    record.set_step(17)
    record.publish("train_one_batch: backward layer fc1", in_comm=False, progressed=True)
    status = liveness.read_record(record.path)
    assert (status.rank, status.size, status.pid, status.step) == (2, 4, os.getpid(), 17)
    assert status.activity == "train_one_batch: backward layer fc1" and not status.in_comm
    assert status.who() == f"rank 2 (pid {os.getpid()} on {status.host})"
    assert liveness.read_all(str(tmp_path / "launch")) == {2: status}
    record.close()
    assert not (tmp_path / "launch").exists()  # the last record out removes the folder


def test_a_rank_that_ended_without_removing_its_record_is_an_ended_rank(tmp_path):
    """A rank killed leaves its record with no process behind it: the one sign, on its node, that the
    SIGTERM the others then get is the launcher ending the job (Open MPI's mpirun), not a stop."""
    folder = str(tmp_path / "launch")
    mine = liveness.StatusRecord(folder, rank=0, size=3)
    killed = subprocess.run([sys.executable, "-c", "import os, sys; from singa_mpi.communication import liveness; "
                             "liveness.StatusRecord(sys.argv[1], rank=2, size=3); os._exit(9)", folder], cwd=ROOT)
    assert killed.returncode == 9
    assert liveness.ended_ranks(folder, but=0) == [2]
    assert liveness.ended_ranks(folder, but=2) == []  # its own rank is never named
    mine.close()


def test_a_rank_stopped_in_the_middle_of_a_write_leaves_its_last_whole_record(tmp_path):
    """SIGSTOP can land between a write's two sequence bumps: the record then still reads as the
    last heartbeat before it (a stall report says "last seen at step N", not "no record")."""
    record = liveness.StatusRecord(str(tmp_path / "launch"), rank=1, size=2)
    record.set_step(284)
    record.publish("train_one_batch: forward layer fc2", in_comm=False, progressed=True)
    record.publish("train_one_batch: backward layer fc2", in_comm=False, progressed=True)
    # the first half of the next write: the copy it goes to now has an odd sequence number, for good
    torn = record._next * liveness.SIZE
    liveness._SEQ.pack_into(record._map, torn, liveness._SEQ.unpack_from(record._map, torn)[0] + 5)
    status = liveness.read_record(record.path)
    assert (status.rank, status.step, status.activity) == (1, 284, "train_one_batch: backward layer fc2")
    record.close()


def test_the_activity_names_the_step_phase_and_the_pending_call():
    from singa_mpi.tracing import Tracer

    tracer = Tracer(0)
    tracer.step = 8
    with tracer.span("train_one_batch", "step"):
        tracer.direction = "backward"
        with tracer.span("fc1", "comm", {"op": "Recv", "peer": "from rank 1"}):
            key, text, in_comm = liveness.activity_of(tracer)
    assert text == "train_one_batch: backward Recv from rank 1 in layer fc1" and in_comm
    assert liveness.activity_of(tracer, "setup: building the nets")[1:] == ("setup: building the nets", False)
    assert liveness.activity_of(tracer)[0] != key  # the spans closed: that is progress


def test_a_step_phase_is_published_as_it_begins_not_at_the_next_heartbeat(tmp_path):
    """A rank killed in the first milliseconds of a checkpoint write is reported as writing it."""
    from types import SimpleNamespace

    from singa_mpi.tracing import Tracer

    record = liveness.StatusRecord(str(tmp_path / "launch"), rank=0, size=2)
    tracer = Tracer(0)
    watchdog = liveness.Watchdog(SimpleNamespace(record=record, rank=0, size=2), tracer, None, poll=3600)
    tracer.on_phase = watchdog.beat  # as RankLife wires it; the thread is never started here
    record.set_step(30)
    with tracer.span("checkpoint", "step"):
        assert liveness.read_record(record.path).activity == "checkpoint"
        with tracer.span("fc1", "forward"):  # inside a phase: left to the heartbeat
            assert liveness.read_record(record.path).activity == "checkpoint"
    assert liveness.read_record(record.path).step == 30
    record.close()


def status(rank, alive_ago=0.0, in_comm=False, state=liveness.RUNNING, pid=None):
    now = time.time()
    return liveness.Status(rank, 3, 3, pid or 2 ** 22 + rank, state, in_comm, 8, now - alive_ago, now - 20, "node",
                           "train_one_batch: forward layer fc1")


def test_blame_names_the_silent_rank_before_the_busy_and_the_waiting_ones():
    now = time.time()
    records = {1: status(1, alive_ago=12.0), 2: status(2, in_comm=True)}
    assert liveness.blame(records, [1, 2], now).startswith(
        f"not responding: rank 1 (pid {2 ** 22 + 1} on node) has shown no sign of life for 12.0s")
    assert liveness.blame({2: status(2, in_comm=True)}, [2], now).startswith(
        "every rank it waits for waits too (a deadlock): rank 2")
    assert "rank 2 (pid" in liveness.blame({2: status(2)}, [2], now) and "no progress for 20.0s" in \
        liveness.blame({2: status(2)}, [2], now)
    assert "rank 1: no status record on this node" in liveness.blame({}, [1], now)
    # a stopped process is told by its state in /proc, whatever its last heartbeat
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while liveness.proc_state(sleeper.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "is stopped (SIGSTOP" in liveness.blame({1: status(1, pid=sleeper.pid)}, [1], now)
        assert f"rank 1 (pid {sleeper.pid}) is stopped" in liveness.blame({}, [1], now, {1: sleeper.pid})
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_patient_wait_ends_only_on_a_rank_without_a_sign_of_life_for_the_whole_timeout():
    records = {1: status(1, alive_ago=0.1), 2: status(2, alive_ago=6.0), 3: status(3, alive_ago=9.0,
                                                                                 state=liveness.IN_MPI_INIT)}
    now = time.time()
    assert liveness.lifeless(records, [1, 2, 3, 4], now, 5.0) == [2]  # 3 in MPI_Init, 4 on another node
    assert liveness.lifeless(records, [1, 2], now, 10.0) == []  # rank 0 timing kernels for minutes is alive


def test_a_wait_on_ranks_still_setting_up_is_not_a_stall():
    now = time.time()
    setting_up = {1: status(1, state=liveness.SETUP)}
    assert liveness.holds_up_setup(setting_up, [1], now)
    assert not liveness.holds_up_setup({1: status(1, state=liveness.SETUP, alive_ago=9)}, [1], now)
    assert not liveness.holds_up_setup({1: status(1, state=liveness.SETUP, in_comm=True)}, [1], now)
    assert not liveness.holds_up_setup({}, [1], now)


class _Waiting:
    """A tracer whose rank has waited in one call for ``ago`` seconds, on rank 1."""

    def __init__(self, ago):
        self.span = types.SimpleNamespace(started=time.perf_counter() - ago, args={"awaits": [1]},
                                          describe=lambda: "step 29 params Allreduce in layer fc1")

    def pending(self, cat):
        return self.span


class _Life:
    def __init__(self, folder):
        self.folder, self.rank, self.size, self.ended = folder, 0, 2, []

    def end_job(self, message, code, stopped=()):
        self.ended.append((message, code))


def test_a_stop_signal_arms_the_watchdog_of_a_run_without_a_stall_timeout(tmp_path):
    """A rank waiting inside MPI's C code cannot run Python's handler: the stop could not end its step,
    and nothing said why.  Armed by the stop, a wait that lasts STOP_PATIENCE seconds from the signal
    on names the rank that holds it up, except one that is writing a checkpoint."""
    life = _Life(str(tmp_path / "launch"))
    peer = liveness.StatusRecord(life.folder, rank=1, size=2)
    try:
        peer.publish("train_one_batch: forward layer slow", in_comm=False, progressed=True)
        watchdog = liveness.Watchdog(life, _Waiting(ago=100.0), None)
        assert watchdog.timeout is None  # the run has no --stall-timeout
        watchdog.stop_signal("SIGTERM")
        assert watchdog.timeout == liveness.STOP_PATIENCE
        watchdog.check()
        assert life.ended == []  # the wait began long before, but the stop gets its whole patience
        watchdog.stopping = (time.perf_counter() - liveness.STOP_PATIENCE - 1, "SIGTERM")
        peer.publish("checkpoint", in_comm=False, progressed=True, state=liveness.CHECKPOINTING)
        watchdog.check()
        assert life.ended == []  # the root may write a checkpoint for minutes
        peer.publish("train_one_batch: forward layer slow", in_comm=False, progressed=True)
        watchdog.check()
        (message, code), = life.ended
        assert code == 4 and message.startswith("rank 0: stalled after SIGTERM: step 29 params Allreduce in layer "
                                                "fc1 (a stop waits 20s for every rank to finish its step")
        assert f"waiting for: rank 1 (pid {os.getpid()} on " in message and "forward layer slow" in message
    finally:
        peer.close()
    mine = liveness.Watchdog(life, None, 60.0)
    mine.stop_signal("SIGTERM")
    assert (mine.timeout, mine.stopping) == (60.0, None)  # the user's --stall-timeout holds


def test_the_first_to_vanish_is_dead_in_every_sighting():
    seen = [{"rank": 2, "noticed": 0.000, "levels": {"0": 0, "1": 0, "2": 1}},
            {"rank": 0, "noticed": 0.020, "levels": {"0": 1, "1": 1, "2": 2}},
            {"rank": 1, "noticed": 0.021, "levels": {"0": 2, "1": 1, "2": 2}}]
    assert guardian.first_gone(seen) == [2]
    late = [{"rank": 2, "noticed": 0.000, "ready": -1.0, "levels": {"0": 1, "2": 1}},
            {"rank": 0, "noticed": 0.030, "ready": -1.0, "levels": {"0": 1, "2": 2}}]
    assert guardian.first_gone(late) == [0, 2]  # both dead when either guardian looked
    assert guardian.earliest_noticed(late, [0, 2]) == [2]  # but rank 2's end was noticed 30 ms first
    close = [dict(late[0]), dict(late[1], noticed=0.002)]
    assert guardian.earliest_noticed(close, [0, 2]) == []  # too close to tell
    # rank 0's guardian was still starting when rank 2's end was noticed: its rank may have died
    # first, unseen (what a kill in the first second looked like on 2 busy cores)
    starting = [dict(late[0]), dict(late[1], ready=-0.001)]
    assert guardian.earliest_noticed(starting, [0, 2]) == []
    assert guardian.earliest_noticed(late[:1] + [{"rank": 1, "noticed": 0.03, "ready": -1.0, "levels": {}}],
                                     [0, 2]) == []  # rank 0 has no guardian at all


def test_ranks_without_a_record_are_candidates_too():
    records = {0: status(0), 2: status(2)}
    assert guardian.unwatched(records) == [1]
    assert guardian.unwatched({0: status(0), 1: status(1), 2: status(2)}) == []


def test_the_first_disagreement_names_what_and_where():
    same = [("seed", "5"), ("the job", "abc")]
    assert first_disagreement([same, same, same]) is None
    assert first_disagreement([same, same, [("seed", "7"), ("the job", "abc")]]) == (2, "seed", "7", "5")
    assert first_disagreement([same, [("seed", "5")]]) == (1, "the job", "(not set)", "abc")


# ------------------------------------------------------------------ helpers for real runs

def data_file(tmp_path):
    data = tmp_path / "data.h5"
    if not data.exists():
        nets.make_data(str(data), 256, (12,), 5)
    return str(data)


def job(tmp_path, name="job", scheme="data", steps=100000, extra="", wide=False):
    text = nets.mlp(data_file(tmp_path), 64, scheme).replace("train_steps: 20", f"train_steps: {steps}")
    text = text.replace("disp_freq: 1", "disp_freq: 50") + extra
    if wide:  # 2000 x 2000 weights: a checkpoint write takes long enough to be caught in it
        text = text.replace("num_output: 16", "num_output: 2000").replace("num_output: 10", "num_output: 2000")
    path = tmp_path / f"{name}.conf"
    path.write_text(text)
    return str(path)


def launch(n, conf, tmp_path, *args, env=None):
    cmd = mpiexec_command(n) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace",
                                str(tmp_path / "ws"), *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env or mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def pids_of(conf, n, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = rank_pids(conf)
        if len(pids) == n:
            return pids
        time.sleep(0.01)
    pytest.fail(f"the {n} ranks did not start within {timeout}s")


def singa_lines(text):
    return [line for line in text.splitlines() if line.startswith("singa-mpi: ") and "warning" not in line]


# ------------------------------------------------------------------ a killed rank is named

@pytest.mark.parametrize("n,victim", [(2, 1), (3, 2), (4, 1)])
@pytest.mark.slow
def test_a_killed_rank_is_named_by_the_survivors(tmp_path, n, victim):
    conf = job(tmp_path)
    proc = launch(n, conf, tmp_path)
    wait_for_progress(proc, tmp_path)
    pid = pids_of(conf, n)[victim]
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    code, _, err = finish(proc, 30)
    assert code != 0 and time.monotonic() - killed_at < 30
    named = [line for line in singa_lines(err) if "vanished" in line]
    assert len(named) == 1, err[-3000:]
    # exactly this rank as a rule; on a node short of cores it may be named among the candidates
    assert re.search(rf"rank {victim} \(pid {pid} on \S+\) at step \d+ \(.+\)", named[0]), named[0]
    assert named[0].startswith(f"singa-mpi: rank {victim} (pid {pid}") or "one of ranks" in named[0], named[0]


@pytest.mark.slow
def test_a_killed_rank_leaves_no_promise_of_a_checkpoint(tmp_path):
    """Open MPI's mpirun SIGTERMs the ranks left when one is killed; rank 0 acknowledged it as a stop,
    "stopping after this step and writing a checkpoint", which the job never got to."""
    conf = job(tmp_path)
    proc = launch(2, conf, tmp_path)
    wait_for_progress(proc, tmp_path)
    os.kill(pids_of(conf, 2)[1], signal.SIGKILL)
    code, _, err = finish(proc, 30)
    assert code != 0 and "writing a checkpoint" not in err, err[-3000:]
    if launcher().flavor == "openmpi":  # (MPICH's hydra kills the others without a SIGTERM)
        assert "SIGTERM: rank 1 has ended, so the launcher is ending the job: no checkpoint can be written" in err, \
            err[-3000:]


@pytest.mark.slow
def test_a_rank_killed_while_the_root_writes_a_checkpoint_is_named(tmp_path):
    conf = job(tmp_path, wide=True, extra="checkpoint_freq: 30\n")
    proc = launch(2, conf, tmp_path)
    pids = pids_of(conf, 2)
    folder = tmp_path / "ws" / "checkpoint"
    deadline = time.monotonic() + 120
    while not glob.glob(str(folder / "step30.h5.tmp*")):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no checkpoint write seen:\n{proc.stderr.read()[-2000:]}")
        time.sleep(0.002)
    os.kill(pids[0], signal.SIGKILL)
    code, _, err = finish(proc, 30)
    named = [line for line in singa_lines(err) if "vanished" in line]
    assert code != 0 and len(named) == 1, err[-3000:]
    assert re.search(rf"rank 0 \(pid {pids[0]} on \S+\) at step (29|30) \(checkpoint", named[0]), named[0]


def _maps(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()
    except OSError:
        return ""


def test_a_rank_killed_while_python_loads_the_package_is_named(tmp_path):
    """SIGKILL while the rank imports numpy (its first second: long before MPI_Init), not after some
    fixed time, which a busy machine would turn into a kill before Python runs a line: the line names
    rank 1, alone or among the candidates."""
    conf = job(tmp_path, steps=5)
    proc = launch(2, conf, tmp_path)
    pid = pids_of(conf, 2)[1]
    deadline = time.monotonic() + 60
    while "numpy" not in _maps(pid):  # numpy's own libraries: the package is loading
        if time.monotonic() > deadline or proc.poll() is not None:
            pytest.fail("rank 1 was not seen loading numpy")
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    code, _, err = finish(proc, 30)
    named = [line for line in singa_lines(err) if "vanished" in line]
    assert code != 0 and len(named) == 1, err[-3000:]
    assert named[0].startswith(f"singa-mpi: rank 1 (pid {pid}") or "one of ranks 0, 1 " in named[0], named[0]


def test_a_rank_that_leaves_before_the_launcher_dismisses_its_early_guardian(tmp_path):
    """The guardian begun at the entry point, for a rank whose command line is refused (exit 2, before
    the launcher takes the guardian over): no "vanished" line, and the status record is removed."""
    env = dict(mpi_env(), PMI_RANK="1", PMI_SIZE="2")
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "train", "--no-such-option"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--no-such-option" not in done.stderr  # rank 1: rank 0 says what is wrong, once for the job
    assert "vanished" not in done.stderr  # (the guardian shares the rank's stderr: run() waited for it)
    folders = glob.glob(f"/dev/shm/singa-mpi-{os.getuid()}-{os.getpid()}-*")  # this test process launched it
    assert not any(os.path.exists(os.path.join(folder, "rank1")) for folder in folders), folders


# ------------------------------------------------------------------ stalls: the one not responding is named

@pytest.mark.slow
def test_a_rank_stopped_in_its_first_second_is_caught_and_named(tmp_path):
    """Stopped before MPI_Init, which waits for every rank: the others' guardians watch that wait."""
    conf = job(tmp_path)
    proc = launch(3, conf, tmp_path, "--stall-timeout", "5")
    pid = pids_of(conf, 3)[2]
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        code, _, err = finish(proc, 40)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert code != 0 and time.monotonic() - stopped_at < 40
    stalled = [line for line in singa_lines(err) if ": stalled: " in line]
    assert len(stalled) == 1, err[-3000:]
    assert re.search(rf"not responding: rank 2 \(pid {pid}( on \S+)?\) is stopped \(SIGSTOP", stalled[0]), stalled[0]
    assert "(--stall-timeout 5s)" in stalled[0] and not [line for line in singa_lines(err) if "vanished" in line]


def _record_of(pid: int, rank: int):
    for folder in glob.glob(f"/dev/shm/singa-mpi-{os.getuid()}-*"):
        status = liveness.read_record(os.path.join(folder, f"rank{rank}"))
        if status is not None and status.pid == pid:
            return status
    return None


@pytest.mark.slow
def test_rank_0_stopped_while_it_reads_the_job_is_named(tmp_path):
    """Rank 0 stopped after MPI_Init, as it reads the job for partition_dim: auto, which the others
    wait for patiently (rank 0 may time kernels for long): a rank that shows no sign of life for the
    whole --stall-timeout is no patient wait; it hung until the fuzz suite's 35 s bound.  The job is
    padded with comments (3.7 MB: about a tenth of a second to parse) so that the phase outlasts a
    heartbeat of the status record: a bare job was read within a millisecond, and the record, rewritten
    every 100 ms, sometimes never showed the phase to the test's polling."""
    conf = job(tmp_path, extra="\n" + "# a comment line that pads the job so that reading it takes a while\n" * 55000)
    proc = launch(3, conf, tmp_path, "--stall-timeout", "5")
    pid = pids_of(conf, 3)[0]
    deadline = time.monotonic() + 60
    while True:
        status = _record_of(pid, 0)
        if status is not None and "reading and planning" in status.activity:
            os.kill(pid, signal.SIGSTOP)
            break
        if time.monotonic() > deadline or proc.poll() is not None:
            pytest.fail("rank 0 was not seen reading the job")
        time.sleep(0.001)
    stopped_at = time.monotonic()
    try:
        code, out, err = finish(proc, 40)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert code in (4, 9, 137) and time.monotonic() - stopped_at < 20, (code, err[-3000:])
    stalled = [line for line in singa_lines(err) if ": stalled: " in line]
    # (the exit code and the launcher's own report on stdout: once in CI, at e983f8d, stderr was empty)
    assert len(stalled) == 1, (code, out[-2000:], err[-3000:])
    assert re.search(rf"not responding: rank 0 \(pid {pid} on \S+\) is stopped \(SIGSTOP", stalled[0]), stalled[0]


@pytest.mark.slow
def test_a_stall_in_training_names_the_stopped_rank(tmp_path):
    conf = job(tmp_path)
    proc = launch(3, conf, tmp_path, "--stall-timeout", "5")
    wait_for_progress(proc, tmp_path)
    pid = pids_of(conf, 3)[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        code, _, err = finish(proc, 40)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    stalled = [line for line in singa_lines(err) if ": stalled: " in line]
    assert code != 0 and len(stalled) == 1, err[-3000:]
    assert re.search(r"^singa-mpi: rank [02]: stalled: step \d+ .* in layer ", stalled[0]), stalled[0]
    assert re.search(rf"not responding: rank 1 \(pid {pid} on \S+\) is stopped \(SIGSTOP, Ctrl-Z or a debugger; "
                     rf"last seen at step \d+: ", stalled[0]), stalled[0]


# ------------------------------------------------------------------ ranks that disagree

def split_launch(tmp_path, first, second, second_workspace="ws"):
    """Rank 0 trains with ``first``'s arguments, rank 1 with ``second``'s (in ``second_workspace``)."""
    base = mpiexec_command(2)[:-2]
    tail, other = ["--workspace", str(tmp_path / "ws")], ["--workspace", str(tmp_path / second_workspace)]
    cmd = (base + ["-n", "1", sys.executable, "-m", "singa_mpi", "train", *first, *tail, ":", "-n", "1",
                   sys.executable, "-m", "singa_mpi", "train", *second, *other])
    return subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120, check=False)


def test_ranks_with_different_jobs_get_the_agreement_message(tmp_path):
    data_split, feature_split = job(tmp_path, "data", "data", steps=20), job(tmp_path, "feature", "feature", steps=20)
    proc = split_launch(tmp_path, [data_split], [feature_split])
    errors = singa_lines(proc.stderr)
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert errors[0] == (f"singa-mpi: error: ranks disagree: layer #1 'fc1' partition_dim is 1 on rank 1 and "
                         f"(not set) on rank 0 (job files: {data_split} on rank 0, {feature_split} on rank 1): "
                         f"expected every rank to run the same job file with the same options")
    assert "Traceback" not in proc.stderr + proc.stdout


def test_a_different_seed_on_one_rank_is_refused(tmp_path):
    conf = job(tmp_path, steps=20)
    proc = split_launch(tmp_path, [conf], [conf, "--seed", "7"])
    errors = singa_lines(proc.stderr)
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert "ranks disagree: the seed (--seed, else the job's seed) is 7 on rank 1 and 5 on rank 0" in errors[0]
    proc = split_launch(tmp_path, [conf], [conf, "--steps", "10"])
    assert proc.returncode == 2 and "the steps to train (--steps, else the job's train_steps) is 10 on rank 1 " \
                                   "and 20 on rank 0" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_a_rank_that_resumes_from_another_step_is_refused_not_left_waiting(tmp_path):
    """--resume where rank 1 does not see rank 0's checkpoints (a workspace on a disk of its node's
    own, or a relative one from another working directory): rank 0 went on from step 20, rank 1 from
    step 0, and each waited in collectives the other never made (killed by the test's timeout)."""
    conf = job(tmp_path, steps=20)
    first = launch(2, conf, tmp_path)
    assert finish(first, 120)[0] == 0
    (tmp_path / "elsewhere").mkdir()  # rank 1's own folder: empty
    proc = split_launch(tmp_path, [conf, "--resume", "--steps", "30"], [conf, "--resume", "--steps", "30"],
                        second_workspace="elsewhere")
    errors = singa_lines(proc.stderr)
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert re.fullmatch(r"singa-mpi: error: ranks disagree: the checkpoint the run starts from is none \(step 0\) "
                        r"on rank 1 and step 20 \(params digest [0-9a-f]{12}\) on rank 0 \(job files: .*\): expected "
                        r"every rank to read the same checkpoint: a workspace .* every node shares, .*", errors[0]), \
        errors[0]
    assert not checkpoint.listed(str(tmp_path / "elsewhere")) and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_ranks_that_read_different_data_files_are_refused(tmp_path):
    """One job file whose relative store path finds another store from rank 1's folder (a stale copy on
    its node's disk): both trained, each on its own data, and the run ended with exit 0."""
    conf = tmp_path / "job.conf"
    conf.write_text(nets.mlp("data.h5", 64, "data", steps=20))
    folders = [tmp_path / "node0", tmp_path / "node1"]
    for seed, folder in enumerate(folders):  # the same shape and labels, other values
        folder.mkdir()
        nets.make_data(str(folder / "data.h5"), 256, (12,), 5, seed=seed)
    rank = [sys.executable, "-m", "singa_mpi", "train", str(conf), "--workspace", str(tmp_path / "ws")]
    cmd = mpiexec_command(2)[:-2] + ["-wdir", str(folders[0]), "-n", "1", *rank, ":", "-wdir", str(folders[1]),
                                     "-n", "1", *rank]
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=120, check=False)
    errors = singa_lines(proc.stderr)
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert re.fullmatch(r"singa-mpi: error: ranks disagree: the first batch of layer 'data' \(train\) is digest "
                        r"[0-9a-f]{12} on rank 1 and digest [0-9a-f]{12} on rank 0 \(job files: .*\): expected every "
                        r"rank to read the same data files: .*", errors[0]), errors[0]
    assert not (tmp_path / "ws" / "metrics.jsonl").exists()  # nothing trained


# ------------------------------------------------------------------ signals at the edges

def test_sigterm_twice_50ms_apart_checkpoints_once_and_exits_75(tmp_path):
    conf = job(tmp_path)
    proc = launch(2, conf, tmp_path)
    wait_for_progress(proc, tmp_path)
    pids = pids_of(conf, 2)
    for _ in range(2):
        for pid in pids.values():
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.05)
    code, out, err = finish(proc, 60)
    assert code == checkpoint.EXIT_CHECKPOINTED, err[-3000:]
    (stopped, _), = checkpoint.listed(str(tmp_path / "ws"))
    assert os.listdir(tmp_path / "ws" / "checkpoint") == [f"step{stopped}.h5"]  # no .tmp left
    assert out.count("stopped on a signal after") == 1 and out.rstrip().splitlines()[-1].startswith("resume with: ")
    assert "Traceback" not in err


SLOW_SETUP = '''
import os, time
from singa_mpi.layers import LAYERS, Layer

@LAYERS.register("kSlowSetup")
class SlowSetup(Layer):
    """Passes its input on; its setup marks that it runs, then takes its time (a big store, say)."""

    def setup(self, src_shapes):
        marks = os.environ["SLOW_SETUP_MARKS"]
        open(os.path.join(marks, f"{os.getpid()}-{time.monotonic_ns()}"), "w").close()
        time.sleep(1.5)
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        return inputs[0]

    def backward(self, grad, need):
        return [grad if need[0] else None]
'''


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.slow
def test_sigterm_while_setting_up_stops_before_training(tmp_path, n):
    plugin, marks = tmp_path / "slow_setup.py", tmp_path / "marks"
    plugin.write_text(SLOW_SETUP)
    marks.mkdir()
    layers = [nets._data_layer(data_file(tmp_path), 64, (12,)), nets._ip("fc1", "data", 16),
              'layer { name: "slow" user_type: "kSlowSetup" srclayers: "fc1" }', nets._act("act1", "slow", "kSTanh"),
              nets._ip("fc3", "act1", 5), nets._loss("fc3")]
    conf = tmp_path / "slow.conf"
    conf.write_text(nets.job_text(layers, steps=50))
    env = mpi_env(SLOW_SETUP_MARKS=str(marks))
    cmd = ([sys.executable] if n == 1 else mpiexec_command(n) + [sys.executable]) + [
        "-m", "singa_mpi", "train", str(conf), "--workspace", str(tmp_path / "ws"), "--plugin", str(plugin)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while len({name.split("-")[0] for name in os.listdir(marks)}) < n:  # every rank is in a layer's setup
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the setup never started:\n{proc.stderr.read()[-2000:]}")
        time.sleep(0.01)
    stop = signal.Signals[launcher().stop_signal] if n > 1 else signal.SIGTERM
    os.kill(proc.pid, stop)  # the launcher forwards it to every rank (Open MPI: SIGUSR1, see launchers.py)
    code, out, err = finish(proc, 120)
    assert code == checkpoint.EXIT_CHECKPOINTED, err[-3000:]
    assert out.count(STOPPED_BEFORE_TRAINING) == 1, out[-3000:]
    assert checkpoint.listed(str(tmp_path / "ws")) == [] and "Traceback" not in err
    assert not (tmp_path / "ws" / "metrics.jsonl").exists() or \
        (tmp_path / "ws" / "metrics.jsonl").read_text().strip() == ""


STUCK_LAYER = '''
import os, time
from singa_mpi.communication.liveness import launched_rank
from singa_mpi.layers import LAYERS, Layer

@LAYERS.register("kStuck")
class Stuck(Layer):
    """Passes its input on; rank 1's 40th training forward marks that it begins, then never ends."""

    calls = 0

    def setup(self, src_shapes):
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        Stuck.calls += train
        if train and Stuck.calls == 40 and launched_rank()[0] == 1:
            open(os.environ["STUCK_MARK"], "w").close()
            time.sleep(300)
        return inputs[0]

    def backward(self, grad, need):
        return [grad if need[0] else None]
'''


@pytest.mark.slow
def test_a_stop_held_up_by_a_layer_that_never_returns_is_acknowledged_and_its_holder_named(tmp_path):
    """SIGTERM to every rank (scancel's way) while rank 1 is stuck in a layer and rank 0 waits for it
    inside MPI: rank 0 used to say nothing and wait until SIGKILL.  Now it acknowledges at once, and
    after STOP_PATIENCE seconds names rank 1 and where it is stuck, and ends the job (exit 4)."""
    plugin, mark = tmp_path / "stuck.py", tmp_path / "stuck"
    plugin.write_text(STUCK_LAYER)
    layers = [nets._data_layer(data_file(tmp_path), 64, (12,)), nets._ip("fc1", "data", 16),
              'layer { name: "stuck" user_type: "kStuck" srclayers: "fc1" }', nets._act("act1", "stuck", "kSTanh"),
              nets._ip("fc3", "act1", 5), nets._loss("fc3")]
    conf = tmp_path / "stuck.conf"
    conf.write_text(nets.job_text(layers, steps=100000))
    cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", str(conf), "--workspace",
                                str(tmp_path / "ws"), "--plugin", str(plugin)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(STUCK_MARK=str(mark)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not mark.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"rank 1 never got stuck:\n{proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    time.sleep(0.5)  # rank 0 is in the step's next collective, waiting for rank 1
    for pid in pids_of(str(conf), 2).values():
        os.kill(pid, signal.SIGTERM)
    signalled = time.monotonic()
    while not (tmp_path / "ws" / "stopped.txt").exists():  # the acknowledgement's note in the workspace
        assert time.monotonic() - signalled < 5, "the stop was not acknowledged while rank 0 waited in MPI"
        time.sleep(0.05)
    code, _, err = finish(proc, 60)
    took = time.monotonic() - signalled
    lines = singa_lines(err)
    assert lines[0].startswith("singa-mpi: SIGTERM: stopping after this step"), err[-3000:]
    stalled = [line for line in lines if ": stalled after SIGTERM: " in line]
    # exit 4 (a stall), or hydra's report of the SIGKILL that MPI_Abort sent the stuck rank (9)
    assert len(stalled) == 1 and code in (4, 9), (code, err[-3000:])
    assert re.search(r"^singa-mpi: rank 0: stalled after SIGTERM: step \d+ .*; waiting for: rank 1 \(pid \d+ on "
                     r"\S+\) is alive but has made no progress for [\d.]+s \(step \d+: train_one_batch: "
                     r"forward layer stuck\)", stalled[0]), stalled[0]
    assert liveness.STOP_PATIENCE <= took < liveness.STOP_PATIENCE + 20, took


def test_a_stop_signal_while_the_package_loads_is_kept_for_the_launcher():
    """What the entry point calls first thing (early_signals.catch_for_command): a SIGTERM during the
    imports is remembered, not fatal, and handed to the launcher once."""
    code = ("import os, signal, sys\n"
            "from singa_mpi import early_signals as early\n"
            "early.catch_for_command(['--debug', 'train', 'job.conf'])\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "import singa_mpi.launcher\n"
            "from singa_mpi.stop_signals import StopSignals\n"
            "stops = StopSignals()\n"
            "stops.install()\n"
            "print(stops.received == signal.SIGTERM, early.early_stop_signal())\n"
            "stops.restore(keep_ignoring=False)\n"
            "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "
            "signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "None", "True", "True"]


def test_the_record_folder_of_an_ended_launch_is_swept(tmp_path):
    stale = tmp_path / f"singa-mpi-{os.getuid()}-999999999-1"
    stale.mkdir()
    (stale / "rank0").write_bytes(bytes(liveness.SIZE))
    with open(f"/proc/{os.getpid()}/stat") as f:
        started = f.read().rsplit(")", 1)[1].split()[19]
    live = tmp_path / f"singa-mpi-{os.getuid()}-{os.getpid()}-{started}"  # this process stands for a launcher
    live.mkdir()
    liveness.sweep_stale(str(tmp_path))
    assert not stale.exists() and live.exists()



def test_a_rank_that_was_itself_stopped_blames_nobody_for_a_while():
    """Its watchdog sees its own clock jump (no poll for seconds): the wait was its own doing. Under
    Open MPI the launcher's abort continues a stopped rank, which then blamed the rank it waited for."""
    life = type("Life", (), {"rank": 0, "size": 2})()
    dog = liveness.Watchdog(life, tracer=None, timeout=10, poll=0.1)
    began = dog._last_poll
    assert not dog.was_suspended(began + 0.1) and not dog.was_suspended(began + 0.25)  # polls on time
    assert dog.was_suspended(began + 30.0)  # stopped for half a minute, then continued
    polls = [began + 30.0 + 0.1 * k for k in range(1, 102)]  # polling on time again
    quiet = [dog.was_suspended(t) for t in polls]
    assert all(quiet[:99]) and not any(quiet[100:])  # quiet for one timeout (10 s), then watching again
