"""Ctrl-C saves: SIGINT finishes the step, checkpoints once and exits 75 with the resume command;
a second Ctrl-C aborts at once (exit 130, one line, no traceback); under mpiexec on 2 ranks."""
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
import types

import nets
import pytest
from singa_mpi import cli
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.trainer import Trainer
from test_mpi_suites import mpi_env, mpiexec_command

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


def ranks_of(pid: int) -> dict[int, int]:
    """{MPI rank: pid} of the processes below ``pid`` (mpiexec -> hydra proxy -> ranks), from /proc."""
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    below, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    ranks = {}
    for child in below:
        try:
            env = pathlib.Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = [v.split(b"=", 1)[1] for v in env if v.startswith((b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK="))]
        if rank and b"python" in pathlib.Path(f"/proc/{child}/cmdline").read_bytes():
            ranks[int(rank[0])] = child
    return ranks


def test_ctrl_c_under_mpiexec_checkpoints_once(tmp_path):
    """SIGINT to mpiexec (hydra forwards it to every rank): one checkpoint, exit 75, and the resume
    command; then SIGINT to rank 1 alone: the vote stops rank 0 after the same step too."""
    conf = job_file(tmp_path)
    for target in ("mpiexec", "rank 1"):
        ws = tmp_path / target.replace(" ", "")
        cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(ws)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        wait_for_progress(ws)
        os.kill(proc.pid if target == "mpiexec" else ranks_of(proc.pid)[1], signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == checkpoint.EXIT_CHECKPOINTED, f"{target}: {err[-3000:]}"
        (stopped, path), = checkpoint.listed(str(ws))
        assert out.count("stopped on a signal after") == 1 and f"after {stopped} steps" in out, target
        assert out.rstrip().splitlines()[-1] == "resume with: " + shlex.join(
            ["mpiexec", "-n", "2", "python", "-m", "singa_mpi", "train", conf, "--workspace", str(ws), "--resume"])
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
    from singa_mpi.launcher import launcher_name

    assert launcher_name(env) == word


def test_the_resume_hint_names_the_launcher_that_started_the_job():
    from singa_mpi.launcher import RunOptions, resume_command

    trainer = types.SimpleNamespace(runtime=types.SimpleNamespace(size=2), cfg=types.SimpleNamespace(path="j.conf"),
                                    workspace="ws")
    tail = ["python", "-m", "singa_mpi", "train", "j.conf", "--workspace", "ws", "--resume"]
    assert resume_command(trainer, RunOptions(), {"OMPI_COMM_WORLD_SIZE": "2"}) == shlex.join(["mpirun", "-n", "2", *tail])
    assert resume_command(trainer, RunOptions(), {"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}) == \
        shlex.join(["mpiexec", "-n", "2", *tail])
    trainer.runtime.size = 1
    assert resume_command(trainer, RunOptions(), {}) == shlex.join(["singa-mpi", *tail[3:]])
