"""The workspace's start-up: the temporary files of the run's writers that were killed are removed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from singa_mpi.workspace import clear_dead_writes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_run_file_writer_killed_mid_write_leaves_a_tmp_file_the_next_start_removes(tmp_path, capsys):
    """A run killed by SIGKILL while writing profile.json left profile.json.tmp<PID> behind for good."""
    killed = f"""
import os, signal
from singa_mpi.checkpoints import hdf5 as checkpoint
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed after writing, before the rename
checkpoint.write_whole({str(tmp_path / "profile.json")!r}, "{{}}")
"""
    result = subprocess.run([sys.executable, "-c", killed], cwd=ROOT, capture_output=True, timeout=60)
    assert result.returncode == -signal.SIGKILL
    left = [name for name in os.listdir(tmp_path) if ".tmp" in name]
    assert len(left) == 1 and left[0].startswith("profile.json.tmp"), left
    dead = dead_pid()
    for name in (f"stopped.txt.tmp{dead}", f"communication.json.tmp{dead}", f"metrics.jsonl.tmp{dead}",
                 f"job.conf.{dead}.tmp"):
        (tmp_path / name).write_text("half")
    live = [f"metrics.jsonl.tmp{os.getppid()}", f"job.conf.{os.getppid()}.tmp"]  # a live writer's: kept
    others = [f"notes.txt.tmp{dead}", f"data.h5.tmp{dead}"]  # not the run's files: not ours to remove
    for name in live + others:
        (tmp_path / name).write_text("busy")
    clear_dead_writes(str(tmp_path))
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "interrupted write of the run's files" in line]
    assert len(notes) == 1 and "removed 5 " in notes[0] and left[0] in notes[0], out
    assert sorted(name for name in os.listdir(tmp_path) if ".tmp" in name) == sorted(live + others)
    clear_dead_writes(str(tmp_path))
    assert capsys.readouterr().out == ""
