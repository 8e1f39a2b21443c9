"""Ctrl-C saves: SIGINT finishes the step, checkpoints once and exits 75 with the resume command;
a second Ctrl-C aborts at once (exit 130, one line, no traceback); under mpiexec on 2 ranks."""
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time
import types

import nets
import numpy as np
import pytest
from singa_mpi import cli
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.trainer import Trainer
from mpi_jobs import launcher, mpi_env, mpiexec_command, ranks_of

ROOT = pathlib.Path(__file__).resolve().parents[1]


def job_file(tmp_path, steps=3000, extra=""):
    data = str(tmp_path / "data.h5")
    nets.make_data(data, 64, (12,), 5)
    path = tmp_path / "job.conf"
    path.write_text(nets.mlp(data, 7, "data", 2, steps=steps) + extra)
    return str(path)


def interrupt_at(monkeypatch, step: int, times: int) -> None:
    """Send this process ``times`` SIGINTs right after training batch ``step``, as Ctrl-C would."""
    original = Trainer.train_one_batch

    def train_one_batch(self, s):
        original(self, s)
        if s == step:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # the handler runs between bytecodes: let it

    monkeypatch.setattr(Trainer, "train_one_batch", train_one_batch)


def test_ctrl_c_finishes_the_step_checkpoints_and_says_how_to_resume(tmp_path, monkeypatch, capfd):
    conf, ws = job_file(tmp_path, steps=20), tmp_path / "ws"
    interrupt_at(monkeypatch, 4, times=1)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == checkpoint.EXIT_CHECKPOINTED
    out, err = capfd.readouterr()
    assert [step for step, _ in checkpoint.listed(str(ws))] == [5]  # the state after batches 0..4
    assert "Ctrl-C: stopping after this step and writing a checkpoint" in err
    assert "stopped on a signal after 5 steps" in out
    resume = shlex.join(["singa-mpi", "train", conf, "--workspace", str(ws), "--resume"])
    assert out.rstrip().splitlines()[-1] == f"resume with: {resume}"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    monkeypatch.undo()
    assert cli.main(["train", conf, "--workspace", str(ws), "--resume"]) == 0
    assert checkpoint.listed(str(ws))[0][0] == 20


def test_a_stop_at_the_last_step_ends_the_complete_run_with_exit_0(tmp_path, monkeypatch, capfd):
    """Ctrl-C during the last step: the run exited 75 'stopped on a signal', skipped its final test, and
    --resume said 'nothing to do'.  The step and its checkpoint are the run's end: exit 0, the final test,
    no resume hint, and stopped.txt says the run is complete."""
    conf = job_file(tmp_path, steps=20, extra="test_freq: 10\ntest_steps: 1\n")
    ws = tmp_path / "ws"
    interrupt_at(monkeypatch, 19, times=1)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == 0
    out, err = capfd.readouterr()
    (step, path), = checkpoint.listed(str(ws))
    assert step == 20
    said = f"SIGINT came at the last step (20): the run is complete; final checkpoint {path}; nothing to resume"
    assert said in out.splitlines() and "resume with" not in out and "stopped on a signal" not in out
    assert "step 20/20  test " in out
    assert (ws / "stopped.txt").read_text() == said + "\n"


def test_second_ctrl_c_aborts_without_a_checkpoint(tmp_path, monkeypatch, capfd):
    conf, ws = job_file(tmp_path, steps=20), tmp_path / "ws"
    interrupt_at(monkeypatch, 4, times=2)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == 130
    out, err = capfd.readouterr()
    assert checkpoint.listed(str(ws)) == []
    assert err.splitlines()[-1] == "singa-mpi: interrupted (second Ctrl-C: stopped without a checkpoint)"
    assert "Traceback" not in err + out


def test_sigint_to_a_serial_process(tmp_path):
    """A real process and a real signal: exit 75, one checkpoint, the resume line last."""
    conf, ws = job_file(tmp_path), tmp_path / "ws"
    cmd = [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(ws)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_progress(ws)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == checkpoint.EXIT_CHECKPOINTED, err[-2000:]
    (stopped, path), = checkpoint.listed(str(ws))
    assert 0 < stopped < 3000 and "Traceback" not in err
    assert f"stopped on a signal after {stopped} steps (checkpoint {path})" in out
    assert out.rstrip().splitlines()[-1].startswith("resume with: singa-mpi train ")


def wait_for_progress(ws, lines=20, timeout=60):
    metrics = ws / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (not metrics.exists() or metrics.read_text().count("\n") < lines):
        time.sleep(0.05)
    assert metrics.exists(), "the run never started"


@pytest.mark.slow
def test_ctrl_c_under_mpiexec_checkpoints_once(tmp_path):
    """SIGINT to mpiexec: one checkpoint and the resume command; then SIGINT to rank 1 alone: the vote
    stops rank 0 after the same step too.  MPICH's hydra forwards the SIGINT to every rank, and exits 75;
    Open MPI's mpirun 4.1 turns it into a SIGTERM to the ranks, stops forwarding their stdout and exits
    1 whatever they saved (docs/slurm-mpi.md): the ranks' lines come on stderr then."""
    conf = job_file(tmp_path)
    openmpi = launcher().flavor == "openmpi"
    for target in ("mpiexec", "rank 1"):
        ws = tmp_path / target.replace(" ", "")
        cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(ws)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        wait_for_progress(ws)
        os.kill(proc.pid if target == "mpiexec" else ranks_of(proc.pid)[1], signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        launcher_stopped_them = openmpi and target == "mpiexec"
        expected = 1 if launcher_stopped_them else checkpoint.EXIT_CHECKPOINTED
        assert proc.returncode == expected, f"{target}: {err[-3000:]}"
        (stopped, path), = checkpoint.listed(str(ws))
        said = err if launcher_stopped_them else out
        lines = re.findall(r"stopped on a signal(?: \(\w+\))? after (\d+) steps", said)  # the summary's aside
        assert lines == [str(stopped)], (target, said[-3000:])
        # the root names the signal, also the one that reached rank 1 alone (the vote carried no name)
        name = "SIGTERM" if launcher_stopped_them else "SIGINT"
        assert (ws / "stopped.txt").read_text().startswith(f"stopped on a signal ({name}) after {stopped} steps"), \
            (target, (ws / "stopped.txt").read_text())
        resume = "resume with: " + shlex.join(["mpirun" if openmpi else "mpiexec", "-n", "2", "python", "-m", "singa_mpi",
                                               "train", conf, "--workspace", str(ws), "--resume"])
        assert said.rstrip().splitlines()[-1].endswith(resume), (target, said[-3000:])
        assert "Traceback" not in err, err[-3000:]


# ------------------------------------------------------------------ the resume hint names the launcher

@pytest.mark.parametrize("env, word", [
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}, "mpirun"),  # Open MPI's mpirun/mpiexec
    ({"OMPI_COMM_WORLD_SIZE": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}, "mpirun"),  # in sbatch
    ({"PMI_SIZE": "2", "PMI_RANK": "0", "MPI_LOCALNRANKS": "2"}, "mpiexec"),  # MPICH's hydra
    ({"PMI_SIZE": "2", "MPI_LOCALNRANKS": "1", "SLURM_STEP_ID": "0"}, "mpiexec"),  # hydra's proxies via srun
    ({"PMI_SIZE": "2", "PMI_RANK": "1", "SLURM_STEP_ID": "3", "SLURM_STEP_NUM_TASKS": "2"}, "srun"),  # --mpi=pmi2
    ({"PMIX_RANK": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "srun"),  # --mpi=pmix
    ({"SLURM_STEP_ID": "batch", "SLURM_STEP_NUM_TASKS": "1", "PMI_SIZE": "2"}, "mpiexec"),
    ({}, "mpiexec"),  # nothing announced: the MPI standard's name
])
def test_the_launcher_is_told_by_what_it_announced(env, word):
    from singa_mpi.launcher.start import launcher_name

    assert launcher_name(env) == word


def test_the_resume_hint_names_the_launcher_that_started_the_job():
    from singa_mpi.launcher import RunOptions
    from singa_mpi.launcher.train import resume_command

    trainer = types.SimpleNamespace(runtime=types.SimpleNamespace(size=2), cfg=types.SimpleNamespace(path="j.conf"),
                                    workspace="ws")
    tail = ["python", "-m", "singa_mpi", "train", "j.conf", "--workspace", "ws", "--resume"]
    assert resume_command(trainer, RunOptions(), {"OMPI_COMM_WORLD_SIZE": "2"}) == \
        shlex.join(["mpirun", "-n", "2", *tail])
    assert resume_command(trainer, RunOptions(), {"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}) == \
        shlex.join(["mpiexec", "-n", "2", *tail])
    trainer.runtime.size = 1
    assert resume_command(trainer, RunOptions(), {}) == shlex.join(["singa-mpi", *tail[3:]])


def test_the_resume_hint_of_a_framework_job_launches_every_group_and_server():
    """A worker's runtime counts the workers of its group: Sandblaster's 2 workers and a server need
    3 ranks, Downpour's 2 groups of 1 worker and a server too (the hint said 2, and `singa-mpi`)."""
    from singa_mpi.launcher import RunOptions
    from singa_mpi.launcher.train import resume_command

    tail = ["python", "-m", "singa_mpi", "train", "j.conf", "--workspace", "ws", "--resume"]
    for group in (2, 1):
        world = types.SimpleNamespace(size=3)
        runtime = types.SimpleNamespace(size=group, place=types.SimpleNamespace(world=world))
        trainer = types.SimpleNamespace(runtime=runtime, cfg=types.SimpleNamespace(path="j.conf"), workspace="ws")
        assert resume_command(trainer, RunOptions(), {"PMI_SIZE": "3", "MPI_LOCALNRANKS": "3"}) == \
            shlex.join(["mpiexec", "-n", "3", *tail])


# ------------------------------------------------------------------ what was saved, in every case

def test_a_stop_leaves_what_it_saved_in_the_workspace(tmp_path, monkeypatch, capfd):
    """WORKSPACE/stopped.txt: the stop's outcome where output can be lost (Open MPI's mpirun stops
    forwarding the ranks' output when it is signalled); the acknowledgement on stderr names it."""
    conf, ws = job_file(tmp_path, steps=20), tmp_path / "ws"
    interrupt_at(monkeypatch, 4, times=1)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == checkpoint.EXIT_CHECKPOINTED
    out, err = capfd.readouterr()
    (_, path), = checkpoint.listed(str(ws))
    resume = "resume with: " + shlex.join(["singa-mpi", "train", conf, "--workspace", str(ws), "--resume"])
    assert (ws / "stopped.txt").read_text().splitlines() == [f"stopped on a signal (SIGINT) after 5 steps: checkpoint "
                                                            f"{path}", resume]
    assert f"what was saved: {ws / 'stopped.txt'}" in err


def test_a_stop_that_is_cut_short_has_said_what_there_was(tmp_path, monkeypatch):
    """Before the checkpoint is written (the launcher may kill the ranks first), stopped.txt names the
    newest checkpoint there is."""
    from singa_mpi.stop_signals import StopSignals

    conf, ws = job_file(tmp_path, steps=20, extra="checkpoint_freq: 3\n"), tmp_path / "ws"
    seen = []
    original = Trainer.train_one_batch

    def train_one_batch(self, s):
        original(self, s)
        if s == 4:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            seen.append((ws / "stopped.txt").read_text())

    monkeypatch.setattr(Trainer, "train_one_batch", train_one_batch)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == checkpoint.EXIT_CHECKPOINTED
    assert seen == [f"SIGTERM at step 4: stopping after this step and writing a checkpoint; if the run ends before it "
                    f"is written, the newest good checkpoint is {ws / 'checkpoint' / 'step3.h5'} (step 3)\n"]
    assert StopSignals  # the handler that wrote it


def test_a_stop_s_acknowledgement_names_the_newest_good_checkpoint(tmp_path):
    """stopped.txt, while the stop's checkpoint is on its way, named the newest checkpoint file, damaged or
    not: step6.h5, which a --resume skips, though step 3 is what the run goes on from."""
    from singa_mpi.stop_signals import StopSignals

    def acknowledged() -> str:
        stops = StopSignals(is_root=True)
        stops.trainer = types.SimpleNamespace(training=True, workspace=str(tmp_path), stop_requested=False,
                                              stop_signal=None,
                                              runtime=types.SimpleNamespace(tracer=types.SimpleNamespace(step=7)))
        stops.ended_ranks = lambda: []
        stops._request_stop(signal.SIGTERM, None)
        return (tmp_path / "stopped.txt").read_text()

    for step in (3, 6):
        checkpoint.write(checkpoint.checkpoint_path(str(tmp_path), step),
                         checkpoint.Checkpoint(step=step, params={"w": np.ones((2, 2), np.float32)}))
    damaged = checkpoint.checkpoint_path(str(tmp_path), 6)
    with open(damaged, "r+b") as f:
        f.seek(-9, os.SEEK_END)
        f.write(b"\xff" * 9)
    assert acknowledged() == (f"SIGTERM at step 7: stopping after this step and writing a checkpoint; if the run "
                              f"ends before it is written, the newest good checkpoint is "
                              f"{checkpoint.checkpoint_path(str(tmp_path), 3)} (step 3)\n")
    os.remove(checkpoint.checkpoint_path(str(tmp_path), 3))
    assert acknowledged().endswith("if the run ends before it is written, there is no good checkpoint (the run "
                                   "would start again at step 0)\n")


def test_a_stop_signal_after_another_rank_ended_promises_no_checkpoint(tmp_path, capfd):
    """Open MPI's mpirun SIGTERMs the ranks left when one is killed: rank 0 said "stopping after this
    step and writing a checkpoint", which the job never got to (the killed rank cannot finish the
    step).  With a rank of its node ended unannounced, it says that no checkpoint can be written."""
    from singa_mpi.stop_signals import StopSignals

    stops = StopSignals(is_root=True)
    stops.trainer = types.SimpleNamespace(training=True, workspace=str(tmp_path), stop_requested=False,
                                          stop_signal=None, runtime=types.SimpleNamespace(tracer=types.SimpleNamespace(step=7)))
    stops.ended_ranks = lambda: [1]
    stops._request_stop(signal.SIGTERM, None)
    line = ("rank 1 has ended, so the launcher is ending the job: no checkpoint can be written; there is no "
            "checkpoint (the run would start again at step 0)")
    assert capfd.readouterr().err == f"singa-mpi: SIGTERM: {line} (also in {tmp_path / 'stopped.txt'})\n"
    assert (tmp_path / "stopped.txt").read_text() == f"SIGTERM at step 7: {line}\n"


def fill(fd: int) -> None:
    """Fill a pipe's buffer, as a launcher that stopped reading leaves it."""
    os.set_blocking(fd, False)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(fd, True)


def test_a_rank_does_not_wait_for_a_launcher_that_stopped_reading():
    """Open MPI's mpirun reads none of the ranks' output from the moment it is signalled until it has
    killed them: a progress line per step filled the terminal buffer and rank 0 hung in write(), so no
    rank reached the stop vote, nothing was saved. On a launched rank stdout never blocks the run."""
    from singa_mpi import progress

    reader, writer = os.pipe()
    fill(writer)
    stream = open(writer, "w", closefd=False)
    output = progress.ForwardedOutput(stream)
    began = time.monotonic()
    for n in range(2000):
        print(f"step {n}", file=output, flush=True)
    assert time.monotonic() - began < 1.0 and not output.isatty()
    deadline = time.monotonic() + 5
    while not output.stalled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert output.stalled()
    began = time.monotonic()
    output.close(timeout=30)  # gives up at once on a launcher that does not read
    assert time.monotonic() - began < 2.0
    os.close(reader)  # the blocked write fails (EPIPE) and the writer thread ends
    os.close(writer)


def test_forwarded_output_keeps_the_order_of_the_lines():
    from singa_mpi import progress

    reader, writer = os.pipe()
    output = progress.ForwardedOutput(open(writer, "w", closefd=False))
    lines = [f"line {n} é" for n in range(3000)]  # more than the pipe holds: the reader drains it
    got = []
    import threading

    drain = threading.Thread(target=lambda: got.append(b"".join(iter(lambda: os.read(reader, 65536), b""))))
    drain.start()
    for line in lines:
        output.write(line)
        output.write("\n")
    output.close(timeout=30)
    os.close(writer)
    drain.join(timeout=30)
    assert got[0].decode().splitlines() == lines


def open_mpi_or_skip():
    from singa_mpi.communication.launchers import LauncherNotFound, find_launcher

    try:
        return find_launcher("openmpi")
    except LauncherNotFound as err:
        pytest.skip(str(err))


def test_a_failed_run_under_open_mpis_mpirun_ends_at_once_in_the_helpers_environment():
    """Open MPI's mpirun 4.1 waits odls_base_sigkill_timeout seconds twice after a rank exits non-zero
    (an error line, an abort, exit 75), even when every rank has already ended.  The helper set 5 s, so
    every failed run under it ended about 9 s after its ranks; it now leaves Open
    MPI's 1 s.  A user's own setting still wins."""
    variable = "OMPI_MCA_odls_base_sigkill_timeout"
    open_mpi = open_mpi_or_skip()
    env = open_mpi.environ({k: v for k, v in os.environ.items() if k != variable})
    assert variable not in env
    began = time.monotonic()
    done = subprocess.run(open_mpi.command(2) + [sys.executable, "-c", "import sys; sys.exit(2)"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - began
    assert done.returncode == 2 and took < 5, (done.returncode, took, done.stderr[-2000:])
    assert open_mpi.environ({variable: "30"})[variable] == "30"


CHATTY = '''
from singa_mpi.layers import LAYERS, Layer

@LAYERS.register("kChatty")
class Chatty(Layer):
    """Passes its input on and prints 2 KB a batch on every rank: a job whose output outruns the buffer
    between a rank and a launcher that stopped reading it."""

    def setup(self, src_shapes):
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        print("chatty " + "x" * 2000, flush=True)
        return inputs[0]

    def backward(self, grad, need):
        return [grad if need[0] else None]
'''


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_sigterm_or_ctrl_c_to_open_mpis_mpirun_saves_a_checkpoint_and_says_so(tmp_path, stop):
    """`mpirun -n 2 ... train`, SIGTERM or SIGINT to mpirun: it sends the ranks SIGCONT, stops forwarding
    their output, SIGTERM after odls_base_sigkill_timeout seconds, SIGKILL as long after.  The run was
    lost silently (no checkpoint, no line, exit 1): a rank blocked writing to the full terminal buffer
    never reached the stop vote.  Now the ranks checkpoint in that time and the outcome is in
    WORKSPACE/stopped.txt and on stderr."""
    open_mpi = open_mpi_or_skip()
    plugin, data = tmp_path / "chatty.py", str(tmp_path / "data.h5")
    plugin.write_text(CHATTY)
    nets.make_data(data, 64, (12,), 5)
    layers = [nets._data_layer(data, 7, (12,)), nets._ip("fc1", "data", 16),
              'layer { name: "chatty" user_type: "kChatty" srclayers: "fc1" }', nets._act("act1", "chatty", "kSTanh"),
              nets._ip("fc3", "act1", 5), nets._loss("fc3")]
    conf, ws = tmp_path / "job.conf", tmp_path / "ws"
    conf.write_text(nets.job_text(layers, steps=100000))
    cmd = open_mpi.command(2) + [sys.executable, "-m", "singa_mpi", "train", str(conf), "--workspace", str(ws),
                                 "--plugin", str(plugin)]
    env = open_mpi.environ(mpi_env(), OMP_NUM_THREADS="1", OMPI_MCA_odls_base_sigkill_timeout="4")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for_progress(ws, lines=20)
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    listed = checkpoint.listed(str(ws))
    assert len(listed) == 1, err[-3000:]
    (stopped, path), = listed
    assert 20 <= stopped < 100000
    resume = "resume with: " + shlex.join(["mpirun", "-n", "2", "python", "-m", "singa_mpi", "train", str(conf),
                                           "--workspace", str(ws), "--plugin", str(plugin), "--resume"])
    # the ranks get SIGTERM from mpirun whichever signal mpirun got
    assert (ws / "stopped.txt").read_text().splitlines() == [
        f"stopped on a signal (SIGTERM) after {stopped} steps: checkpoint {path}", resume]
    said = out + err  # the stop's line on stdout, or on stderr when mpirun no longer read stdout
    assert f"stopped on a signal after {stopped} steps (checkpoint {path})" in out or \
        f"singa-mpi: stopped on a signal (SIGTERM) after {stopped} steps: checkpoint {path}" in err, said[-3000:]
    assert "stopping after this step and writing a checkpoint" in err
    assert f"what was saved: {ws / 'stopped.txt'}" in err
    assert "Traceback" not in said


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_a_stop_signal_while_the_package_loads_is_acknowledged_at_once(rank, said):
    """Under Open MPI's default (SIGKILL 1 s after the SIGTERM) a rank still loading the package is killed
    before the launcher could say anything: rank 0 says at once that the run stops before training."""
    code = ("import os, signal\n"
            "from singa_mpi import early_signals as early\n"
            "early.catch_for_command(['train', 'job.conf'])\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "import time; time.sleep(0.05)\n"
            "print(early.early_stop_signal() == signal.SIGTERM)\n")
    env = dict(os.environ, OMPI_COMM_WORLD_RANK=rank, OMPI_COMM_WORLD_SIZE="2")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stderr[-2000:]
    line = "singa-mpi: SIGTERM while starting: stopping before training; nothing is written"
    assert proc.stderr.splitlines() == ([line] if said else [])


def test_a_signal_before_training_is_acknowledged_as_such(tmp_path, monkeypatch, capfd):
    """A stop signal once the nets are built but before the first step: the run stops there, and the
    acknowledgement says so (it said "writing a checkpoint")."""
    from singa_mpi.launcher import train as training
    from singa_mpi.stop_signals import STOPPED_BEFORE_TRAINING

    conf, ws = job_file(tmp_path, steps=20), tmp_path / "ws"
    original = training._load_initial_state

    def load_then_signal(trainer, *args, **kwargs):
        original(trainer, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)

    monkeypatch.setattr(training, "_load_initial_state", load_then_signal)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == checkpoint.EXIT_CHECKPOINTED
    out, err = capfd.readouterr()
    assert "singa-mpi: SIGTERM: stopping before training starts; nothing is written" in err.splitlines()
    assert (ws / "stopped.txt").read_text().splitlines() == [STOPPED_BEFORE_TRAINING]
    assert checkpoint.listed(str(ws)) == []


def test_what_a_rank_printed_is_written_before_it_aborts_the_job():
    """MPI_Abort ends the process at once: the forwarded output is drained first."""
    from singa_mpi import progress

    code = ("import os, sys\n"
            "from singa_mpi import progress\n"
            "with progress.forwarded_stdout(launched=True):\n"
            "    for n in range(20000):\n"
            "        print(f'line {n}')\n"
            "    progress.drain_stdout()\n"
            "    os._exit(3)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stdout.splitlines()[-1] == "line 19999", proc.stderr[-2000:]
    assert progress.drain_stdout() is None  # no forwarded output here: nothing to wait for
