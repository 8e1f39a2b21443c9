"""Disk trouble ends with one line naming the path and what to do, exit code 3 (DataError), serially
and under `mpiexec -n 2`: a full disk while writing a checkpoint (the previous checkpoints intact, no
part of the new one left), a read-only checkpoint folder or file system, a workspace under a regular
file or with a name too long.  Problems knowable before training are found before any communication.

The full and read-only disks are real where this process may mount a tmpfs (root with CAP_SYS_ADMIN,
as in the project's containers); elsewhere those tests are skipped and the monkeypatched ones stand in.
"""
import contextlib
import errno
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import nets
from singa_mpi import cli
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.errors import DataError
from singa_mpi.launcher import RunOptions, run_training
from checkpoint_jobs import folder_failing_fsync
from mpi_jobs import mpi_env, mpiexec_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def job(tmp_path, steps: int = 4, extra: str = "") -> str:
    data = tmp_path / "data.h5"
    if not data.exists():
        nets.make_data(str(data), 64, (12,), 5)
    conf = tmp_path / "job.conf"
    conf.write_text(nets.mlp(str(data), 8, "data", steps=steps) + extra)
    return str(conf)


def cli_train(nranks: int, conf: str, workspace, *args: str) -> subprocess.CompletedProcess:
    launcher = mpiexec_command(nranks) if nranks > 1 else []
    cmd = launcher + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(workspace), *args]
    return subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=180)


def one_error_line(result: subprocess.CompletedProcess, *words: str) -> str:
    """The run ended with exit code 3 and one error line holding ``words``, and no traceback."""
    assert result.returncode == DataError.exit_code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("singa-mpi:")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def snapshot_of(workspace) -> dict:
    """Every checkpoint file's bytes, and the names of any other files in the checkpoint folder."""
    folder = checkpoint.checkpoint_dir(str(workspace))
    files = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            files[name] = f.read()
    return files


# ------------------------------------------------------------------ a failing write, simulated

@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES], ids=["full", "read-only", "denied"])
def test_a_checkpoint_write_the_disk_refuses_is_one_line_and_leaves_the_old_ones(tmp_path, monkeypatch, capsys,
                                                                                  code):
    conf = job(tmp_path, steps=2, extra="checkpoint_after: 2 checkpoint_freq: 2\n")
    ws = tmp_path / "ws"
    assert run_training(conf, lambda cfg: str(ws), RunOptions()) == 0
    before = snapshot_of(ws)
    real_fsync = os.fsync

    def refusing_fsync(fd):  # the data is written; the disk refuses it when flushed
        if ".tmp" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", refusing_fsync)
    assert cli.main(["train", conf, "--workspace", str(ws), "--resume", "--steps", "4"]) == DataError.exit_code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"singa-mpi: error: {checkpoint.checkpoint_path(str(ws), 4)}: cannot write the "
                               f"checkpoint: {os.strerror(code)}: ")
    assert "--workspace" in lines[0] and "previous checkpoints are intact" in lines[0]
    assert snapshot_of(ws) == before  # step 2 as it was; no step4.h5, no .tmp file


def test_an_interrupted_in_memory_write_touches_nothing(tmp_path):
    """The file is built in memory: a failure while building it leaves the folder untouched."""
    ckpt = checkpoint.Checkpoint(step=3, params={"w": np.ones((2, 2), np.float32), "b": np.zeros(2, np.float32)})
    target = checkpoint.checkpoint_path(str(tmp_path), 3)
    with pytest.raises(OSError, match="injected fault"):
        checkpoint.write(target, ckpt, fault_after=1)
    assert not os.path.exists(checkpoint.checkpoint_dir(str(tmp_path)))


# ------------------------------------------------------------------ workspaces that cannot be used

def bad_workspace(tmp_path, kind: str):
    """A workspace path under a regular file, or with a component too long for any file system."""
    if kind == "under a file":
        (tmp_path / "a_file").write_text("not a folder")
        return tmp_path / "a_file" / "ws", ["a_file is a file, not a folder", "choose another --workspace"]
    return tmp_path / ("w" * 300), ["File name too long", "choose a shorter --workspace"]


@pytest.mark.parametrize("kind", ["under a file", "name too long"])
def test_an_unusable_workspace_is_one_line_before_training(tmp_path, capsys, kind):
    conf = job(tmp_path)
    workspace, words = bad_workspace(tmp_path, kind)
    with pytest.raises(DataError) as err:
        run_training(conf, lambda cfg: str(workspace), RunOptions())
    assert all(word in str(err.value) for word in words) and "\n" not in str(err.value), str(err.value)
    assert "step " not in capsys.readouterr().out  # no training step ran
    assert cli.main(["train", conf, "--workspace", str(workspace)]) == DataError.exit_code


@pytest.mark.parametrize("kind", ["under a file", "name too long"])
def test_an_unusable_workspace_under_mpi_is_one_line_from_phase_1(tmp_path, kind):
    conf = job(tmp_path)
    workspace, words = bad_workspace(tmp_path, kind)
    line = one_error_line(cli_train(2, conf, workspace), *words)
    assert line.startswith("singa-mpi: error") and "rank 1" not in line  # the vote, not an abort


# ------------------------------------------------------------------ real full and read-only disks

@contextlib.contextmanager
def mounted(target, *mount_args: str):
    """``mount *mount_args target`` for the duration, or skip where this process may not mount."""
    os.makedirs(target, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a file system needs root")
    result = subprocess.run(["mount", *mount_args, str(target)], capture_output=True, text=True)
    if result.returncode:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def fill(folder, leave: int) -> None:
    """Fill the file system of ``folder`` but for about ``leave`` bytes."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    with open(os.path.join(folder, "filler"), "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


@pytest.mark.parametrize("nranks", [1, 2])
@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint(tmp_path, nranks):
    """A 256 KiB tmpfs: the first run's checkpoint fits; with ~8 KiB left, the next one (24 KiB) cannot."""
    conf = job(tmp_path, steps=2)
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=256k", "tmpfs") as disk:
        ws = disk / "ws"
        assert cli_train(nranks, conf, ws).returncode == 0
        before = snapshot_of(ws)
        fill(disk, leave=8192)
        line = one_error_line(cli_train(nranks, conf, ws, "--resume", "--steps", "4"),
                              "step4.h5: cannot write the checkpoint: No space left on device", "the disk is full")
        assert snapshot_of(ws) == before, line  # step 2 intact; no step4.h5, no .tmp file
        os.remove(disk / "filler")
        assert cli_train(nranks, conf, ws, "--resume", "--steps", "4").returncode == 0  # room again: goes on


@pytest.mark.parametrize("nranks", [1, 2])
def test_a_read_only_checkpoint_folder_is_found_before_training(tmp_path, nranks):
    conf = job(tmp_path, steps=2)
    ws = tmp_path / "ws"
    assert cli_train(1, conf, ws).returncode == 0
    before = snapshot_of(ws)
    folder = checkpoint.checkpoint_dir(str(ws))
    with mounted(folder, "--bind", folder):
        subprocess.run(["mount", "-o", "remount,bind,ro", folder], check=True)
        result = cli_train(nranks, conf, ws, "--resume", "--steps", "4")
        one_error_line(result, f"{folder}: cannot write into this workspace folder: Read-only file system",
                       "choose a --workspace on a writable one")
        assert "step 2/4" not in result.stdout  # found in phase 1: no step trained
    assert snapshot_of(ws) == before


@pytest.mark.parametrize("nranks", [1, 2])
def test_a_workspace_on_a_read_only_file_system(tmp_path, nranks):
    conf = job(tmp_path)
    with mounted(tmp_path / "ro", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs") as disk:
        one_error_line(cli_train(nranks, conf, disk / "ws"), f"{disk / 'ws'}: cannot write into this workspace "
                       f"folder: Read-only file system", "choose a --workspace on a writable one")


def leftovers(folder) -> list[str]:
    """Temporary files of interrupted writes anywhere under ``folder``."""
    return sorted(os.path.join(d, name) for d, _, names in os.walk(folder) for name in names if ".tmp" in name)


def test_a_stop_note_that_cannot_be_written_leaves_no_part_of_it(tmp_path):
    """stopped.txt is written whole or not at all: a failing write once left stopped.txt.tmp<PID>."""
    from singa_mpi.trainer import write_stop_note

    (tmp_path / "stopped.txt").mkdir()  # what cannot be replaced, as a full disk refuses the write
    (tmp_path / "stopped.txt" / "x").write_text("")
    assert write_stop_note(str(tmp_path), ["stopped on a signal"]) is None
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("nranks", [1, 2])
def test_a_run_whose_profile_cannot_be_written_after_its_checkpoint_ends_well(tmp_path, nranks):
    """A disk that refused profile.json (or communication.json) after the last checkpoint was written:
    the run ended with a traceback (exit 1, an abort under MPI) and left the file's .tmp<PID>.  The
    run's checkpoint stands: one note each, exit 0, nothing half-written."""
    conf = job(tmp_path, steps=2)
    ws = tmp_path / "ws"
    for name in ("profile.json", "communication.json"):  # in the way of their writers' rename
        (ws / name).mkdir(parents=True)
        (ws / name / "x").write_text("")
    result = cli_train(nranks, conf, ws)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    notes = [line for line in result.stdout.splitlines() if ": not written: " in line]
    written = ["profile.json", "communication.json"] if nranks > 1 else ["profile.json"]  # (serially: none)
    assert sorted(notes) == sorted(f"note: {ws / name}: not written: Is a directory: check the disk or choose "
                                   f"another --workspace" for name in written), result.stdout[-3000:]
    assert checkpoint.read(checkpoint.checkpoint_path(str(ws), 2)).step == 2
    assert leftovers(ws) == []


@pytest.mark.parametrize("nranks", [1, 2])
def test_metrics_that_cannot_be_written_are_one_line_exit_3(tmp_path, nranks):
    """metrics.jsonl refused (a full disk mid-run; here a folder in its way): a traceback (exit 1, an
    abort under MPI).  Now the one line a checkpoint that cannot be written gives, exit 3."""
    conf = job(tmp_path, steps=2)
    ws = tmp_path / "ws"
    (ws / "metrics.jsonl").mkdir(parents=True)
    (ws / "metrics.jsonl" / "x").write_text("")
    one_error_line(cli_train(nranks, conf, ws), f"{ws / 'metrics.jsonl'}: cannot write the run's metrics: ",
                   "the previous checkpoints are intact")
    assert leftovers(ws) == []


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP, errno.ENOSYS])
def test_a_file_system_that_cannot_fsync_a_folder_still_takes_checkpoints(tmp_path, monkeypatch, code):
    """Some file systems (FUSE mounts, SMB shares) refuse fsync on a folder as unsupported: every run
    there ended at its first checkpoint, exit 3, saying it could not write a checkpoint it had written
    whole and renamed.  Such a refusal is no failure, as where the folder cannot be opened."""
    conf = job(tmp_path, steps=4, extra="checkpoint_after: 2 checkpoint_freq: 2\n")
    ws = tmp_path / "ws"
    real_fsync = os.fsync

    def folder_refusing_fsync(fd):
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", folder_refusing_fsync)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == 0
    assert [step for step, _ in checkpoint.listed(str(ws))] == [4, 2]
    assert checkpoint.read(checkpoint.checkpoint_path(str(ws), 4)).step == 4
    assert leftovers(ws) == []


def not_durable(path: str, after: str) -> str:
    folder = os.path.dirname(path)
    return (f"{path}: the checkpoint is written whole and in place, but may not survive a crash of the machine: "
            f"the file system reported Input/output error (EIO) when making it durable (fsync of {folder}): "
            f"check the disk{after}")


def test_a_folder_fsync_that_fails_for_another_reason_still_fails_the_write(tmp_path, monkeypatch):
    """An I/O error making the rename durable is reported (the disk is failing), as before, but as what
    it is: it said the checkpoint could not be written, of a file whole at its final name."""
    folder_failing_fsync(monkeypatch)
    ckpt = checkpoint.Checkpoint(step=3, params={"w": np.ones((2, 2), np.float32)})
    path = checkpoint.checkpoint_path(str(tmp_path), 3)
    with pytest.raises(DataError) as err:
        checkpoint.write(path, ckpt)
    assert str(err.value) == not_durable(path, checkpoint.RUN_GOES_ON), err.value
    assert "cannot write" not in str(err.value)
    assert checkpoint.read(path).step == 3 and leftovers(tmp_path) == []


def test_a_run_whose_checkpoint_folder_cannot_be_made_durable_stops_saying_the_file_is_there(tmp_path, monkeypatch,
                                                                                            capsys):
    """The run stops at that checkpoint, exit 3 (the disk is failing), in one line that says the file
    is in place rather than that it could not be written."""
    conf = job(tmp_path, steps=4, extra="checkpoint_after: 2 checkpoint_freq: 2\n")
    ws = tmp_path / "ws"
    folder_failing_fsync(monkeypatch)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == DataError.exit_code
    lines = capsys.readouterr().err.strip().splitlines()
    path = checkpoint.checkpoint_path(str(ws), 2)
    assert lines == [f"singa-mpi: error: {not_durable(path, checkpoint.RUN_GOES_ON)}"], lines
    assert checkpoint.read(path).step == 2


def test_a_stop_whose_checkpoint_cannot_be_written_says_so_in_stopped_txt(tmp_path, monkeypatch, capfd):
    """stopped.txt kept saying the stop's checkpoint was on its way after the disk had refused it (exit
    3): it now says the write failed and names the newest good checkpoint."""
    import shlex
    import signal

    from singa_mpi.trainer import Trainer

    conf = job(tmp_path, steps=20, extra="checkpoint_freq: 3\n")
    ws = tmp_path / "ws"
    original_batch, real_write = Trainer.train_one_batch, checkpoint._write_durably

    def stopped_after_batch_4(self, step):  # Ctrl-C during batch 4: the stop's checkpoint is step5.h5
        original_batch(self, step)
        if step == 4:
            signal.raise_signal(signal.SIGINT)

    def full_at_step_5(path, image):
        if path.endswith("step5.h5"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, image)

    monkeypatch.setattr(Trainer, "train_one_batch", stopped_after_batch_4)
    monkeypatch.setattr(checkpoint, "_write_durably", full_at_step_5)
    assert cli.main(["train", conf, "--workspace", str(ws)]) == DataError.exit_code
    (line,) = [line for line in capfd.readouterr().err.splitlines() if line.startswith("singa-mpi: error: ")]
    resume = "resume with: " + shlex.join(["singa-mpi", "train", conf, "--workspace", str(ws), "--resume"])
    assert (ws / "stopped.txt").read_text().splitlines() == [
        f"SIGINT: the stop's checkpoint after 5 steps could not be written ({line.removeprefix('singa-mpi: error: ')}); "
        f"the newest good checkpoint is {checkpoint.checkpoint_path(str(ws), 3)} (step 3)", resume]
    assert leftovers(ws) == []


# a run's command with fsync of one folder failing with EIO, in every rank: python FOLDER ARGS...
FAILING_FOLDER = """
import errno, os, sys
folder, real = os.path.realpath(sys.argv[1]), os.fsync
def failing(fd):
    if os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")) == folder:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    real(fd)
os.fsync, sys.argv = failing, ["singa-mpi"] + sys.argv[2:]
from singa_mpi.__main__ import run
sys.exit(run())
"""


def in_place(path: str) -> str:
    return (f"the file is written whole and in place, but may not survive a crash of the machine: the file system "
            f"reported Input/output error (EIO) when making it durable (fsync of {os.path.dirname(path)}): check "
            f"the disk")


@pytest.mark.parametrize("nranks", [1, 2])
def test_a_run_s_other_files_whose_folder_cannot_be_made_durable_are_said_to_be_in_place(tmp_path, nranks):
    """profile.json, communication.json and the --trace timeline, written whole and renamed into place
    when the fsync of their folder failed (EIO), were said to be "not written" (the timeline: "could not
    write"); their notes now say they are in place and what the disk did.  The checkpoints' folder is
    sound: the run ends well."""
    conf = job(tmp_path, steps=2)
    ws = tmp_path / "ws"
    ws.mkdir()
    trace = ws / "trace.json"
    launcher = mpiexec_command(nranks) if nranks > 1 else []
    cmd = launcher + [sys.executable, "-c", FAILING_FOLDER, str(ws), "train", conf, "--workspace", str(ws),
                      "--trace", str(trace)]
    result = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "not written" not in result.stdout and "could not write" not in result.stdout, result.stdout[-3000:]
    names = ["profile.json", "communication.json"] if nranks > 1 else ["profile.json"]  # (serially: no table)
    notes = [line for line in result.stdout.splitlines() if line.startswith("note: ")]
    assert sorted(notes) == sorted(f"note: {ws / name}: {in_place(str(ws / name))}" for name in names), notes
    (line,) = [line for line in result.stdout.splitlines() if line.startswith(f"timeline {trace}: ")]
    assert line.endswith(f"chrome://tracing ({in_place(str(trace))})"), line
    assert all((ws / name).is_file() for name in names + ["trace.json"]) and leftovers(ws) == []


def test_a_stop_note_whose_folder_cannot_be_made_durable_is_named(tmp_path, monkeypatch):
    """stopped.txt in place but its folder's fsync failed: the stop's line left it out (as not written)."""
    from singa_mpi.trainer import write_stop_note

    folder_failing_fsync(monkeypatch)
    assert write_stop_note(str(tmp_path), ["stopped on a signal"]) == str(tmp_path / "stopped.txt")
    assert (tmp_path / "stopped.txt").read_text() == "stopped on a signal\n"


def test_a_note_of_a_file_not_written_or_not_durable_is_worded_in_one_place(tmp_path, monkeypatch):
    from singa_mpi import durable

    folder_failing_fsync(monkeypatch)
    path = str(tmp_path / "profile.json")
    with pytest.raises(durable.NotDurable) as err:
        durable.write_whole(path, "{}")
    assert checkpoint.not_written(err.value) == in_place(path)
    assert durable.not_durable(err.value, "the checkpoint") == in_place(path).replace("the file", "the checkpoint", 1)
    refused = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert checkpoint.not_written(refused) == f"not written: {checkpoint.disk_problem(refused)}"


def test_a_script_s_job_conf_whose_folder_cannot_be_made_durable_is_a_note_not_a_traceback(tmp_path, monkeypatch,
                                                                                          capsys):
    """fit() writes WORKSPACE/job.conf once the run is the job's: a failed fsync of its folder (the file
    in place) was an OSError out of fit, after the file was written."""
    import singa_mpi.api as sm

    ws = tmp_path / "ws"
    ws.mkdir()
    folder, real = str(ws), os.fsync

    def failing(fd):
        if os.readlink(f"/proc/self/fd/{fd}") == folder:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    sm.Job.from_conf(job(tmp_path, steps=2)).fit(ws)
    path = str(ws / "job.conf")
    assert f"note: {path}: {in_place(path)}" in capsys.readouterr().out.splitlines()
    assert (ws / "job.conf").is_file()


def test_a_script_s_job_conf_the_disk_refuses_is_one_line_not_the_os_exception(tmp_path, monkeypatch):
    """fit() writing WORKSPACE/job.conf on a full disk raised the OS's own OSError out of fit (a traceback
    in the script); it is one DataError line, naming the file and the disk's reason, as a checkpoint's."""
    import singa_mpi.api as sm
    import singa_mpi.launcher.train as train
    from singa_mpi.errors import DataError

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(train, "write_job_file", full)
    ws = tmp_path / "ws"
    with pytest.raises(DataError, match=r"job\.conf: cannot write the run's job file: No space left on device: "):
        sm.Job.from_conf(job(tmp_path, steps=2)).fit(ws)
