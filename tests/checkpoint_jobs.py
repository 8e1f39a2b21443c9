"""The checkpoint tests' job (tests/nets.py's 12-16-10-5 MLP on 64 synthetic rows) trained in this
process or under mpiexec, its checkpoint at a step, and a checkpoint in the previous file format.

Shared by the checkpoint tests, test_bptt.py, test_launcher.py, test_timeline.py, test_progress.py and
cost/test_beside.py.
"""
import errno
import json
import os
import pathlib
import subprocess
import sys

import h5py

import nets
from mpi_jobs import mpi_env, mpiexec_command
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.launcher import RunOptions, run_training


ROOT = pathlib.Path(__file__).resolve().parents[1]


def job_file(tmp_path, scheme="data", steps=20, batch=7, name="job", extra="", disp_freq=1):
    data = tmp_path / "data.h5"
    if not data.exists():
        nets.make_data(str(data), 64, (12,), 5)
    text = nets.mlp(str(data), batch, scheme, 3).replace("train_steps: 20", f"train_steps: {steps}")
    text = text.replace("disp_freq: 1\n", f"disp_freq: {disp_freq}\n")
    path = tmp_path / f"{name}.conf"
    path.write_text(text + extra)
    return str(path)


def train(conf, workspace, **options):
    return run_training(conf, lambda cfg: str(workspace), RunOptions(**options))


def final(workspace, step):
    return checkpoint.read(checkpoint.checkpoint_path(str(workspace), step))


def train_records(workspace) -> list[dict]:
    """metrics.jsonl's train lines: step, loss and accuracy (not the times)."""
    lines = (pathlib.Path(workspace) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k in ("step", "loss", "accuracy")}
            for line in lines if '"train"' in line]


def mpi_train(n, conf, workspace, *args, timeout=300):
    env = mpi_env()
    cmd = mpiexec_command(n) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(workspace),
                                *args]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def write_format_2(path: str, ckpt: checkpoint.Checkpoint) -> None:
    """The previous format as singa_mpi wrote it: no job identity, no header checksum, /job_config and
    /plan without checksums."""
    with h5py.File(path, "w") as f:
        f.attrs.update(format_version=2, step=ckpt.step, job_name=ckpt.job_name, seed=ckpt.seed,
                       nranks=ckpt.nranks, elapsed=ckpt.elapsed, complete=0)
        f.create_dataset("job_config", data=ckpt.job_config)
        f.create_dataset("plan", data="{}")
        for name, value in ckpt.params.items():
            f.create_dataset(f"params/{name}", data=value).attrs["crc32"] = checkpoint.crc(value)
        for name, slots in ckpt.updater.items():
            for slot, value in slots.items():
                f.create_dataset(f"updater/{name}/{slot}", data=value).attrs["crc32"] = checkpoint.crc(value)
            f[f"updater/{name}"].attrs.update(ckpt.counters.get(name, {}))
        for phase, layers in ckpt.readers.items():
            for layer, state in layers.items():
                f.create_group(f"readers/{phase}/{layer}").attrs.update(state)
        f.attrs["complete"] = 1


def as_newer_format(path: str) -> None:
    """Make the checkpoint at ``path`` one a newer singa_mpi would write: its format version one above
    this one's, its checksums and seal made anew (so it is sound, only newer)."""
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = checkpoint.FORMAT_VERSION + 1
        f.attrs["header_crc32"] = checkpoint._layout_crc(f)
    with open(path, "rb") as f:
        image = checkpoint.seal(f.read())
    with open(path, "wb") as f:
        f.write(image)


def folder_failing_fsync(monkeypatch) -> None:
    """fsync of a folder fails with EIO (a failing disk); of a file it works."""
    real_fsync = os.fsync

    def failing(fd):
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
